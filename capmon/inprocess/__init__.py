"""capmon in process: real openai / anthropic / google-genai SDK clients (and httpx clients for anything
that takes one) whose every request goes through the process's one engine, by the same
request handling as ``capmon serve``.

- ``home.py``: one engine per process: its config, the loop it runs in (a background
  thread for sync callers, the caller's loop for async ones), fork, closing at exit;
- ``transport.py``: the httpx transports: a request handed to the gateway's ASGI app on
  the engine's loop, its answer streamed back;
- ``clients.py``: the SDK and httpx constructors (``max_retries=0``, a placeholder key).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from capmon.core.base.extras import Extra, require

# Every request is handed to the gateway's app (starlette, prometheus-client): without the
# gateway extra the first use says so in one line (an ImportError too, as imports fail).
require(Extra.GATEWAY, "capmon.inprocess (the in-process SDK clients)")

from capmon.inprocess.clients import (  # noqa: E402
    anthropic_client,
    async_anthropic_client,
    async_httpx_client,
    async_openai_client,
    genai_client,
    httpx_client,
    openai_client,
)
from capmon.inprocess.home import RUNTIME, InProcessError  # noqa: E402
from capmon.runtime import Engine  # noqa: E402

T = TypeVar("T")


def close_engine() -> None:
    """Close the process's engine now (it closes at exit anyway); the next request starts
    a new one. From any thread but the engine's own loop (there: :func:`aclose_engine`)."""
    RUNTIME.close()


async def aclose_engine() -> None:
    """Close the process's engine from async code (a web app's shutdown, for one)."""
    await RUNTIME.aclose()


def engine() -> Engine | None:
    """The process's running engine (its client's ``snapshot()`` for one), or None before
    the first request. Change it only on its own loop (:func:`call_in_engine`)."""
    home = RUNTIME.current()
    return home.engine if home is not None else None


def call_in_engine(fn: Callable[[Engine], T]) -> T:
    """``fn(engine)`` run on the engine's loop (``lambda e: e.client.trip("flagship")``),
    from any other thread; returns what it returns."""
    return RUNTIME.call(fn)


__all__ = [
    "InProcessError",
    "aclose_engine",
    "anthropic_client",
    "async_anthropic_client",
    "async_httpx_client",
    "async_openai_client",
    "call_in_engine",
    "close_engine",
    "engine",
    "genai_client",
    "httpx_client",
    "openai_client",
]
