"""capmon: keep LLM API work running when models are at capacity.

The public API::

    from capmon import FallbackClient, Request, ChatResult, RequestFailed, load_config, open_engine

and the in-process SDK clients (capmon/inprocess, imported on first use, with openai,
anthropic or google-genai only when their constructor is called)::

    client = capmon.openai_client()        # also async_openai_client, anthropic_client,
                                           # async_anthropic_client, genai_client (its .aio too),
                                           # httpx_client, async_httpx_client

See README.md ("Use it as a library", "Your SDK, in process"), docs/library.md and docs/sdk.md
(the whole of each), and ARCHITECTURE.md.
"""

import warnings
from typing import TYPE_CHECKING, Any

from capmon.core.base.exceptions import CannotWait, CapmonError, ConfigError, DeadlineExceeded, RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types.result import Attempt, ChatResult, Request
from capmon.lazy import lazy_exports
from capmon.runtime import Engine, open_engine
from capmon.runtime import load as load_config

if TYPE_CHECKING:
    from capmon.inprocess import (
        aclose_engine,
        anthropic_client,
        async_anthropic_client,
        async_httpx_client,
        async_openai_client,
        close_engine,
        genai_client,
        httpx_client,
        openai_client,
    )

_IN_PROCESS = (
    "openai_client",
    "async_openai_client",
    "anthropic_client",
    "async_anthropic_client",
    "genai_client",
    "httpx_client",
    "async_httpx_client",
    "close_engine",
    "aclose_engine",
)
_lazy = lazy_exports("capmon", dict.fromkeys(_IN_PROCESS, "capmon.inprocess"))
# Old names users may import, still served: a request in any format is a Request.
_DEPRECATED = {"ChatRequest": "Request"}


def __getattr__(name: str) -> Any:
    new = _DEPRECATED.get(name)
    if new is not None:
        warnings.warn(f"capmon.{name} is capmon.{new} now", DeprecationWarning, stacklevel=2)
        return globals()[new]
    return _lazy(name)


__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "CannotWait",
    "CapmonError",
    "Request",
    "ChatResult",
    "ConfigError",
    "DeadlineExceeded",
    "Engine",
    "FallbackClient",
    "RequestFailed",
    "aclose_engine",
    "anthropic_client",
    "async_anthropic_client",
    "async_httpx_client",
    "async_openai_client",
    "close_engine",
    "genai_client",
    "httpx_client",
    "load_config",
    "open_engine",
    "openai_client",
]
