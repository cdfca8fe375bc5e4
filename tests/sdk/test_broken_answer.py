"""The in-process transport when the app behind it breaks: it ends an answer before the
body's end, or raises before it answers. The gateway never does either on purpose (a
broken stream ends with an error event), so only a bug or a stopping engine reaches these
paths; here an app that breaks on purpose takes the place of the engine's gateway app,
behind the real transport, on a real engine's home. The caller must see a broken answer,
never a short one passed off as whole, and never a hang."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import capmon
from capmon.inprocess.home import RUNTIME, Home
from tests.sdk.helpers import config

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

ENDED = "ended the answer before its end"
PIECE = b'{"half": '


async def cut_short(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """Starts an answer, sends part of its body and returns as if it were done."""
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": PIECE, "more_body": True})


async def raises(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    await receive()
    raise RuntimeError("a bug in the gateway")


def _swap(home: Home, app: Any) -> None:
    home.app = app


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[Any]:
    yield config(tmp_path)


async def test_a_plain_answer_cut_short_is_broken_not_short(cfg: Any) -> None:
    async with capmon.async_httpx_client(cfg) as http:
        assert (await http.get("/health")).status_code == 200  # the engine is up on this loop
        _swap(await RUNTIME.for_async(), cut_short)
        with pytest.raises(httpx.RemoteProtocolError, match=ENDED):
            await http.post("/v1/chat/completions", json={"model": "auto", "messages": []})


async def test_a_stream_cut_short_breaks_when_read(cfg: Any) -> None:
    async with capmon.async_httpx_client(cfg) as http:
        assert (await http.get("/health")).status_code == 200
        _swap(await RUNTIME.for_async(), cut_short)
        body = {"model": "auto", "messages": [], "stream": True}  # not inlined: the body streams
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            got = b""
            with pytest.raises(httpx.RemoteProtocolError, match=ENDED):
                async for piece in r.aiter_bytes():
                    got += piece
            assert got == PIECE  # what came is given; the end never passes for the answer's end


async def test_an_app_that_raises_is_a_failed_answer(cfg: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with capmon.async_httpx_client(cfg) as http:
        assert (await http.get("/health")).status_code == 200
        _swap(await RUNTIME.for_async(), raises)
        with pytest.raises(httpx.RemoteProtocolError, match=r"failed before it answered \(RuntimeError\)"):
            await http.post("/v1/chat/completions", json={"model": "auto", "messages": [], "stream": True})
    assert "the in-process gateway failed on POST /v1/chat/completions" in caplog.text


def test_a_sync_stream_cut_short_breaks_when_read(cfg: Any) -> None:
    with capmon.httpx_client(cfg, timeout=30) as http:
        assert http.get("/health").status_code == 200  # the background home is up
        home = RUNTIME.for_sync()
        home.loop.call_soon_threadsafe(_swap, home, cut_short)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), home.loop).result(timeout=10)  # the swap is done
        with http.stream("POST", "/v1/chat/completions", json={"model": "auto", "messages": []}) as r:
            assert r.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError, match=ENDED):
                r.read()
