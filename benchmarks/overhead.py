"""Client overhead: CPU per request of raw aiohttp, raw httpx, httpx on the aiohttp transport
and capmon's FallbackClient on each transport, for plain and streaming requests.

    python -m benchmarks.overhead [--requests 5000] [--concurrency 32] [--reps 5]
                                  [--kinds KIND ...] [--modes plain stream]
                                  [--cross | --sdk]
                                  [--profile FILE] [--profile-kind KIND] [--profile-mode MODE]

An instant OpenAI-style endpoint (a bare ASGI app under uvicorn, no sleep) runs in its
own process: a POST answers with a small chat completion, or, when the body asks for
``"stream": true``, with an SSE stream of a few chunks (role, three pieces of text, the
finish reason), each its own write, then ``data: [DONE]``. Each measurement runs in a
fresh client process: a warm-up of 300 requests, then ``--requests`` requests with
``--concurrency`` tasks, and the process's CPU time (``time.process_time()``: user +
system of the client process only) over the measured requests is divided by their
number. Within a repetition every (mode, kind) pair is measured once, the kinds in
turn, the order reversed every other repetition, so drift on a shared machine hits
every kind alike; the report gives each one's median and its ratio to raw aiohttp's
median (goal: capmon <= 3x raw aiohttp, streaming included).

What each kind does per request (the least a correct client does, or capmon's whole path):

* ``aiohttp``: ``ClientSession.post(json=body)`` on a connector limited to the
  concurrency, check the status, ``json.loads`` the body, read the content; streaming:
  read the body line by line, ``json.loads`` each ``data:`` line up to ``[DONE]``;
* ``httpx``: ``httpx.AsyncClient`` on httpx's own transport (httpcore), limited to the
  concurrency, the same steps (streaming with ``client.stream()`` and ``aiter_lines()``);
* ``httpx-aiohttp``: the same httpx client on ``capmon.core.routing.transport.make_transport("aiohttp")``
  (httpx-aiohttp's transport with capmon's mends); ``httpx-aiohttp-pkg`` (only with
  ``--kinds``): on httpx-aiohttp's transport as the package ships it;
* ``capmon-httpx`` / ``capmon-aiohttp``: ``FallbackClient.chat(text)`` (streaming:
  ``FallbackClient.stream(text)``, every piece) with three models on the instant endpoint
  and ``transport=make_transport(...)``: choose a target (breaker, limiter, buckets),
  send, classify, update breaker / limiter / stats, publish events on a bus with no
  subscriber, build the ChatResult.

In-process SDK clients (``--sdk``: these kinds and ``capmon-aiohttp``, the library's own
``client.chat``, in one run), each the real openai SDK's ``AsyncOpenAI`` (``sdk-*-sync``:
``OpenAI`` from ``--concurrency`` threads) on the same three-model config:

* ``sdk-null`` / ``sdk-null-sync``: the SDK on a transport that answers from memory (the
  instant endpoint's bytes, no HTTP): what the SDK itself costs (its request building, its
  pydantic parsing; the sync one, the threads too);
* ``sdk-direct``: the SDK straight at the instant endpoint on its own HTTP stack, no capmon;
* ``sdk-inprocess`` / ``sdk-inprocess-sync``: ``capmon.async_openai_client(cfg)`` /
  ``capmon.openai_client(cfg)``: the SDK, capmon's in-process transport, the gateway's app
  and the FallbackClient (async: on the caller's loop; sync: the engine's background thread);
* ``sdk-gateway``: the SDK at ``capmon serve``'s app under uvicorn on a loopback port, in
  the same process (so the CPU counted is the SDK's, the gateway's and the client's alike);
* ``sdk-floor``: the SDK on the least a transport over ``client.chat`` can do, and no
  more: ``json.loads`` the body, ``FallbackClient.chat`` (streaming: ``stream_chunks`` in
  a task of its own, each chunk a ``data:`` frame through a queue), ``json.dumps`` the
  answer into a response with one header. No request id, no checks, no who-served
  headers, no error shapes: not a client anyone should use, but the floor under any
  in-process transport, capmon's included.

The report says what capmon costs under the SDK (a kind minus ``sdk-null``, or
``sdk-null-sync`` for the sync kind: the transport, the gateway's request handling, the
FallbackClient and its HTTP to the endpoint) against what ``client.chat`` costs
(``capmon-aiohttp``: the FallbackClient and its HTTP); goal: at most 1.2x. ``sdk-floor``'s
row is what that subtraction gives for a transport that adds nothing to ``client.chat``:
whatever it shows above 1x is what the SDK and the engine cost together beyond their
parts (a request waiting on real I/O inside the SDK's own call, which ``sdk-null``'s
answer from memory never does), and no transport can come in under it.

``--profile FILE`` also runs one kind once under cProfile and prints the top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.procs import free_port, spawn, stop, wait_port

HERE = Path(__file__).resolve().parent
ANSWER = json.dumps(
    {
        "id": "chatcmpl-instant",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "instant",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()


def _sse(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-instant",
        "object": "chat.completion.chunk",
        "created": 1767225600,
        "model": "instant",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


STREAM = [
    _sse({"role": "assistant", "content": ""}),
    _sse({"content": "o"}),
    _sse({"content": "k"}),
    _sse({"content": "!"}),
    _sse({}, "stop"),
    b"data: [DONE]\n\n",
]
STREAM_USAGE = (
    b"data: "
    + json.dumps(
        {
            "id": "chatcmpl-instant",
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": "instant",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        }
    ).encode()
    + b"\n\n"
)
STREAM_TEXT = "ok!"


def _event(name: str, **fields: Any) -> bytes:
    return f"event: {name}\ndata: ".encode() + json.dumps({"type": name, **fields}).encode() + b"\n\n"


def _message(content: list[dict[str, Any]], stop: str | None, output_tokens: int) -> dict[str, Any]:
    usage = {"input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    return {
        "id": "msg_instant",
        "type": "message",
        "role": "assistant",
        "model": "instant",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": output_tokens},
    }


# Anthropic's Messages API, the same answer: a message, or the stream Anthropic sends
# (with its ping), each event its own write.
MESSAGE = json.dumps(_message([{"type": "text", "text": "ok"}], "end_turn", 1)).encode()
MESSAGE_STREAM = [
    _event("message_start", message=_message([], None, 1)),
    _event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
    _event("ping"),
    *(_event("content_block_delta", index=0, delta={"type": "text_delta", "text": t}) for t in STREAM_TEXT),
    _event("content_block_stop", index=0),
    _event("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None}, usage={"output_tokens": 3}),
    _event("message_stop"),
]
KEY = "sk-capmon-sim-demo"
WARMUP = 300
KINDS = ["aiohttp", "httpx", "httpx-aiohttp", "capmon-httpx", "capmon-aiohttp"]
# Not measured unless asked for (--kinds): httpx-aiohttp's transport as the package ships it.
EXTRA_KINDS = ["httpx-aiohttp-pkg"]
MODES = ["plain", "stream"]
GOAL = 3.0  # capmon's CPU per request at most this many times raw aiohttp's
# Across formats (--cross): FallbackClient.chat() / .messages() with two models, one per
# wire, the named one preferred; kind -> (the caller's format, the serving model's wire).
CROSS_KINDS = {
    "chat-on-openai": ("chat", "openai"),
    "chat-on-anthropic": ("chat", "anthropic"),
    "messages-on-anthropic": ("messages", "anthropic"),
    "messages-on-openai": ("messages", "openai"),
}
CROSS_PAIRS = [("chat-on-anthropic", "chat-on-openai"), ("messages-on-openai", "messages-on-anthropic")]
CROSS_GOAL = 1.25  # a cross-format request's CPU at most this many times the same-format one's
# In-process SDK clients (--sdk), against the library's own client.chat (capmon-aiohttp).
SDK_KINDS = [
    "capmon-aiohttp",
    "sdk-null",
    "sdk-null-sync",
    "sdk-direct",
    "sdk-inprocess",
    "sdk-inprocess-sync",
    "sdk-gateway",
    "sdk-floor",
]
SDK_GOAL = 1.2  # capmon's in-process SDK client's CPU per request at most this many times client.chat's
ALL_KINDS = list(dict.fromkeys(KINDS + EXTRA_KINDS + list(CROSS_KINDS) + SDK_KINDS))


# ---------------------------------------------------------------- the instant endpoint


async def instant_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    anthropic = scope["path"].endswith("/messages")
    if b'"stream": true' in body or b'"stream":true' in body:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )
        if anthropic:
            pieces = MESSAGE_STREAM
        elif b'"include_usage": true' in body or b'"include_usage":true' in body:
            pieces = [*STREAM[:-1], STREAM_USAGE, STREAM[-1]]
        else:
            pieces = STREAM
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    answer = MESSAGE if anthropic else ANSWER
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": answer})


def serve(port: int) -> None:
    import uvicorn

    uvicorn.run(
        instant_app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
    )


# ---------------------------------------------------------------- one measurement


def _config(base_url: str, concurrency: int):
    from benchmarks.peers.capmon_client import bench_config

    return bench_config(base_url, _limits(concurrency))


def _limits(concurrency: int) -> list[str]:
    # Room for the whole concurrency on the first model from the start, so the measured
    # part is routing, not queueing behind a limiter still slow-starting.
    return [
        f"limiter.initial={concurrency}",
        f"limiter.max={max(64, concurrency)}",
        f"client.max_connections={concurrency}",
    ]


def _cross_config(base_url: str, concurrency: int, serving: str):
    """An OpenAI-wire model ("gpt") and an Anthropic-wire one ("claude") on the instant
    endpoint, the one on the ``serving`` wire first (the other is the fallback, as in a
    real two-provider config: each request checks whether it could carry it)."""
    from benchmarks.peers.capmon_client import bench_config

    origin = base_url.removesuffix("/v1")
    endpoints = (
        f'[simulator]\nenabled = false\n\n[[endpoints]]\nname = "openai"\nbase_url = "{base_url}"\n'
        f'keys = [{{ env = "KEY" }}]\n\n[[endpoints]]\nname = "anthropic"\napi = "anthropic"\n'
        f'base_url = "{origin}"\nkeys = [{{ env = "KEY" }}]\n'
    )
    models = {
        wire: f'[[models]]\nname = "{name}"\nendpoints = ["{wire}"]\ncontext_window = 128000\nmax_tokens = 512\n'
        for name, wire in (("gpt", "openai"), ("claude", "anthropic"))
    }
    order = [serving, *(w for w in models if w != serving)]
    head = endpoints + "\n" + "\n".join(models[w] for w in order)
    return bench_config(base_url, _limits(concurrency), head=head)


async def _drive(call: Callable[[], Awaitable[None]], n: int, concurrency: int) -> None:
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    await asyncio.gather(*[worker() for _ in range(concurrency)])


def _check_text(text: str, want: str) -> None:
    if text != want:
        raise RuntimeError(f"expected {want!r}, got {text!r}")


def _sse_text(lines: list[str]) -> str:
    parts: list[str] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return "".join(parts)
        parts.append(json.loads(data)["choices"][0]["delta"].get("content") or "")
    raise RuntimeError("the stream ended before [DONE]")


async def _client(kind: str, mode: str, base_url: str, concurrency: int) -> tuple[Callable[[], Awaitable[None]], Any]:
    """(one request, close) for ``kind`` in ``mode``."""
    import httpx

    from capmon.core.routing.transport import make_transport

    stream = mode == "stream"
    body = {"model": "sim-flagship", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 512, "n": 1}
    if stream:
        body["stream"] = True
    url = base_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {KEY}"}
    if kind == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

        async def call() -> None:
            async with session.post(url, json=body, headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"status {r.status}")
                if stream:
                    lines = [raw.decode() async for raw in r.content]
                    _check_text(_sse_text(lines), STREAM_TEXT)
                else:
                    data = json.loads(await r.read())
                    _check_text(data["choices"][0]["message"]["content"], "ok")

        return call, session.close
    if kind in ("httpx", "httpx-aiohttp", "httpx-aiohttp-pkg"):
        transport: httpx.AsyncBaseTransport | None = None
        if kind == "httpx-aiohttp":
            transport = make_transport("aiohttp", max_connections=concurrency, connect_timeout=10.0)
        elif kind == "httpx-aiohttp-pkg":
            import httpx_aiohttp

            transport = httpx_aiohttp.AiohttpTransport(limits=httpx.Limits(max_connections=concurrency))
        client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(30.0, connect=10.0),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )

        async def call() -> None:
            if stream:
                async with client.stream("POST", url, json=body, headers=headers) as r:
                    if r.status_code != 200:
                        raise RuntimeError(f"status {r.status_code}")
                    _check_text(_sse_text([line async for line in r.aiter_lines()]), STREAM_TEXT)
                return
            r = await client.post(url, json=body, headers=headers)
            if r.status_code != 200:
                raise RuntimeError(f"status {r.status_code}")
            _check_text(json.loads(r.content)["choices"][0]["message"]["content"], "ok")

        return call, client.aclose
    if kind in ("capmon-httpx", "capmon-aiohttp"):
        fc = _fallback_client(_config(base_url, concurrency), kind.split("-", 1)[1])

        async def call() -> None:
            if stream:
                _check_text("".join([piece async for piece in fc.stream("Say ok.")]), STREAM_TEXT)
                return
            r = await fc.chat("Say ok.")
            _check_text(r.content, "ok")

        return call, fc.aclose
    if kind in CROSS_KINDS:
        return _cross_client(kind, stream, base_url, concurrency)
    if kind.startswith("sdk-"):
        return await _sdk_client(kind, stream, base_url, concurrency)
    raise ValueError(kind)


async def _sdk_client(
    kind: str, stream: bool, base_url: str, concurrency: int
) -> tuple[Callable[[], Awaitable[None]], Any]:
    """The real openai SDK, straight at the endpoint, through capmon in process, or at
    capmon's gateway in this process."""
    import openai

    import capmon

    cfg = _config(base_url, concurrency)
    messages = [{"role": "user", "content": "Say ok."}]
    closers: list[Callable[[], Awaitable[None]]] = []
    if kind == "sdk-inprocess-sync":
        return _sync_sdk_client(capmon.openai_client(cfg), stream, concurrency)
    if kind == "sdk-null-sync":
        return _sync_sdk_client(_null_sdk(stream, sync=True), stream, concurrency)
    if kind == "sdk-null":
        sdk = _null_sdk(stream, sync=False)
    elif kind == "sdk-direct":
        sdk = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    elif kind == "sdk-inprocess":
        sdk = capmon.async_openai_client(cfg)
        closers.append(capmon.aclose_engine)
    elif kind == "sdk-floor":
        sdk, close_floor = _floor_sdk(cfg)
        closers.append(close_floor)
    elif kind == "sdk-gateway":
        from capmon.core.routing.client import FallbackClient
        from capmon.gateway import close_app, create_app, load_settings, start_server

        fc = FallbackClient(cfg, environ={})
        app = create_app(fc, load_settings(cfg, listen="127.0.0.1:0", environ={}))
        server = await start_server(app, "127.0.0.1", 0)
        sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)

        async def close_gateway() -> None:
            close_app(app)
            await server.stop()
            await fc.aclose()

        closers.append(close_gateway)
    else:
        raise ValueError(kind)

    async def call() -> None:
        if stream:
            chunks = await sdk.chat.completions.create(model="auto", messages=messages, stream=True)  # type: ignore[arg-type]
            _check_text("".join([c.choices[0].delta.content or "" async for c in chunks if c.choices]), STREAM_TEXT)
            return
        r = await sdk.chat.completions.create(model="auto", messages=messages)  # type: ignore[arg-type]
        _check_text(r.choices[0].message.content or "", "ok")

    async def close() -> None:
        await sdk.close()
        for closer in closers:
            await closer()

    return call, close


def _fallback_client(cfg: Any, transport: str) -> Any:
    """The library's own FallbackClient on ``make_transport(transport)`` (``client.chat``'s kinds, the floor)."""
    from capmon.core.routing.client import FallbackClient
    from capmon.core.routing.transport import make_transport

    made = make_transport(
        transport, max_connections=cfg.client.max_connections, connect_timeout=cfg.client.connect_timeout
    )
    return FallbackClient(cfg, environ={}, transport=made)


def _sdk_http() -> Any:
    """The HTTP package the openai SDK is built on (httpx2 for newer ones, else httpx)."""
    from openai import _base_client

    return getattr(_base_client, "httpx2", None) or _base_client.httpx  # type: ignore[attr-defined]


def _null_sdk(stream: bool, *, sync: bool) -> Any:
    """The openai SDK on a transport of its own HTTP package that answers from memory."""
    import openai

    http = _sdk_http()
    if stream:
        body, headers = b"".join(STREAM), {"content-type": "text/event-stream"}
    else:
        body, headers = ANSWER, {"content-type": "application/json"}

    def answer(request: Any) -> Any:
        return http.Response(200, headers=headers, content=body)

    transport = http.MockTransport(answer)
    if sync:
        return openai.OpenAI(
            base_url="http://null.invalid/v1", api_key=KEY, max_retries=0, http_client=http.Client(transport=transport)
        )
    return openai.AsyncOpenAI(
        base_url="http://null.invalid/v1", api_key=KEY, max_retries=0, http_client=http.AsyncClient(transport=transport)
    )


def _floor_sdk(cfg: Any) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """The openai SDK on the least a transport over ``client.chat`` does (``sdk-floor``)."""
    import openai

    from capmon.core.types.result import Request

    http = _sdk_http()
    fc = _fallback_client(cfg, "aiohttp")

    async def produce(request: Request, out: asyncio.Queue[bytes | None]) -> None:
        try:
            async for chunk in fc.stream_chunks(request):
                out.put_nowait(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            out.put_nowait(b"data: [DONE]\n\n")
        finally:
            out.put_nowait(None)

    class Frames(http.AsyncByteStream):  # type: ignore[misc,name-defined]
        """The stream read in a task of its own, its frames handed over by a queue: pulled
        through the SDK's own iteration instead, every chunk would resume the whole chain
        of generators under it, which costs more than capmon's in-process stream does."""

        def __init__(self, request: Request) -> None:
            self.frames: asyncio.Queue[bytes | None] = asyncio.Queue()
            self.task = asyncio.get_running_loop().create_task(produce(request, self.frames))

        async def __aiter__(self) -> Any:
            while (frame := await self.frames.get()) is not None:
                yield frame
            await self.task

    class Floor(http.AsyncBaseTransport):  # type: ignore[misc,name-defined]
        async def handle_async_request(self, request: Any) -> Any:
            body = json.loads(await request.aread())
            asked = Request.of(body["messages"])
            if body.get("stream"):
                return http.Response(200, headers=[(b"content-type", b"text/event-stream")], stream=Frames(asked))
            r = await fc.chat(asked)
            content = json.dumps(r.response).encode()
            return http.Response(200, headers=[(b"content-type", b"application/json")], content=content)

    sdk = openai.AsyncOpenAI(
        base_url="http://floor.invalid/v1",
        api_key=KEY,
        max_retries=0,
        http_client=http.AsyncClient(transport=Floor()),
    )
    return sdk, fc.aclose


def _sync_sdk_client(sdk: Any, stream: bool, concurrency: int) -> tuple[Callable[[], Awaitable[None]], Any]:
    """The sync SDK from ``concurrency`` threads (``_drive``'s tasks each hand their call to one)."""
    from concurrent.futures import ThreadPoolExecutor

    import capmon

    pool = ThreadPoolExecutor(concurrency)
    messages = [{"role": "user", "content": "Say ok."}]

    def one() -> None:
        if stream:
            chunks = sdk.chat.completions.create(model="auto", messages=messages, stream=True)
            _check_text("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), STREAM_TEXT)
            return
        r = sdk.chat.completions.create(model="auto", messages=messages)
        _check_text(r.choices[0].message.content or "", "ok")

    async def call() -> None:
        await asyncio.get_running_loop().run_in_executor(pool, one)

    async def close() -> None:
        pool.shutdown()
        sdk.close()
        capmon.close_engine()

    return call, close


def _cross_client(
    kind: str, stream: bool, base_url: str, concurrency: int
) -> tuple[Callable[[], Awaitable[None]], Any]:
    from capmon.core.routing.client import FallbackClient

    caller, serving = CROSS_KINDS[kind]
    fc = FallbackClient(_cross_config(base_url, concurrency, serving), environ={"KEY": KEY})
    served = "gpt" if serving == "openai" else "claude"
    body = {"messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 512}

    def check(model: str | None) -> None:
        if model != served:
            raise RuntimeError(f"{kind}: served by {model}, not {served}")

    async def call() -> None:
        if stream:
            s = fc.stream_chunks("Say ok.") if caller == "chat" else fc.stream_messages(body)
            _check_text("".join([piece async for piece in s.texts()]), STREAM_TEXT)
            check(s.model)
            return
        r = await (fc.chat("Say ok.") if caller == "chat" else fc.messages(body))
        _check_text(r.content, "ok")
        check(r.model)

    return call, fc.aclose


async def measure(kind: str, mode: str, base_url: str, n: int, concurrency: int) -> dict[str, float]:
    call, close = await _client(kind, mode, base_url, concurrency)
    try:
        await _drive(call, WARMUP, concurrency)
        cpu0, t0 = time.process_time(), time.perf_counter()
        await _drive(call, n, concurrency)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    finally:
        await close()
    return {"cpu": cpu, "wall": wall, "cpu_per_request_us": cpu / n * 1e6, "requests_per_s": n / wall}


# ---------------------------------------------------------------- orchestration


def _run_worker(kind: str, mode: str, base_url: str, n: int, concurrency: int) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.overhead",
            "--worker",
            kind,
            "--mode",
            mode,
            "--url",
            base_url,
            "--requests",
            str(n),
            "--concurrency",
            str(concurrency),
        ],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} {mode} failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def profile(kind: str, mode: str, base_url: str, n: int, concurrency: int, path: str, top: int = 30) -> str:
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(measure(kind, mode, base_url, n, concurrency))
    prof.disable()
    prof.dump_stats(path)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    return buf.getvalue()


def report(runs: dict[tuple[str, str], list[dict[str, float]]], kinds: list[str], modes: list[str]) -> str:
    med = {key: statistics.median(r["cpu_per_request_us"] for r in rs) for key, rs in runs.items()}
    rps = {key: statistics.median(r["requests_per_s"] for r in rs) for key, rs in runs.items()}
    head = "| client |" + "".join(f" {m}: CPU us / request | {m}: x aiohttp | {m}: requests / s |" for m in modes)
    lines = [head, "|---|" + "---|---|---|" * len(modes)]
    for kind in kinds:
        cells = []
        for mode in modes:
            base = med.get(("aiohttp", mode))
            times = f"{med[(kind, mode)] / base:.2f}x" if base else "-"
            cells.append(f" {med[(kind, mode)]:.0f} | {times} | {rps[(kind, mode)]:.0f} |")
        lines.append(f"| {kind} |" + "".join(cells))
    lines.append("")
    lines.append("Runs (CPU us / request, in measurement order):")
    lines.append("")
    for mode in modes:
        for kind in kinds:
            lines.append(f"- {mode} {kind}: " + ", ".join(f"{r['cpu_per_request_us']:.0f}" for r in runs[(kind, mode)]))
    if any(("aiohttp", m) in med for m in modes):
        lines.append("")
        for kind in (k for k in kinds if k.startswith("capmon")):
            for mode in modes:
                base = med.get(("aiohttp", mode))
                if base:
                    ratio = med[(kind, mode)] / base
                    verdict = "**met**" if ratio <= GOAL else f"missed by {(ratio - GOAL) * base:.0f} us / request"
                    lines.append(f"- goal {kind} {mode} <= {GOAL:g}x raw aiohttp: {verdict} ({ratio:.2f}x)")
    lines.extend(cross_report(runs, modes))
    lines.extend(sdk_report(med, modes))
    return "\n".join(lines)


def sdk_report(med: dict[tuple[str, str], float], modes: list[str]) -> list[str]:
    """The in-process SDK clients against the library's own client.chat (capmon-aiohttp):
    what capmon costs under the SDK (the kind minus the SDK alone, sdk-null), and its ratio."""
    rows = []
    for mode in modes:
        lib = med.get(("capmon-aiohttp", mode))
        if not lib:
            continue
        for kind, alone in (
            ("sdk-inprocess", "sdk-null"),
            ("sdk-inprocess-sync", "sdk-null-sync"),
            ("sdk-gateway", "sdk-null"),
            ("sdk-direct", "sdk-null"),
            ("sdk-floor", "sdk-null"),
        ):
            got, base = med.get((kind, mode)), med.get((alone, mode))
            if got is None or base is None:
                continue
            under = got - base
            ratio = under / lib
            verdict = (
                "-"
                if kind in ("sdk-direct", "sdk-floor")
                else "**met**"
                if ratio <= SDK_GOAL
                else f"missed by {(ratio - SDK_GOAL) * lib:.0f} us / request"
            )
            rows.append(
                f"| {kind} | {mode} | {got:.0f} | {base:.0f} ({alone}) | {under:.0f} | {ratio:.2f}x | {verdict} |"
            )
    if not rows:
        return []
    return [
        "",
        f"In-process SDK clients: what capmon costs under the openai SDK (the kind minus the SDK alone) against "
        f"client.chat (capmon-aiohttp); goal: at most {SDK_GOAL:g}x (sdk-direct: the SDK's own HTTP, for scale; "
        "sdk-floor: a transport that adds nothing to client.chat, the least any can show):",
        "",
        "| kind | mode | CPU us / request | the SDK alone | under the SDK | x client.chat | goal |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]


def cross_report(runs: dict[tuple[str, str], list[dict[str, float]]], modes: list[str]) -> list[str]:
    """Each cross-format kind against its same-format one: the ratio of each repetition's
    pair (measured one after the other, so both met the same load), their median, and the
    goal judged on it; the ratio of the two medians beside it."""
    rows = []
    for cross, same in CROSS_PAIRS:
        for mode in modes:
            a, b = runs.get((cross, mode)), runs.get((same, mode))
            if not a or not b:
                continue
            ratios = [x["cpu_per_request_us"] / y["cpu_per_request_us"] for x, y in zip(a, b, strict=True)]
            paired = statistics.median(ratios)
            medians = statistics.median(x["cpu_per_request_us"] for x in a) / statistics.median(
                y["cpu_per_request_us"] for y in b
            )
            verdict = "**met**" if paired <= CROSS_GOAL else f"missed by {paired - CROSS_GOAL:.2f}x"
            each = ", ".join(f"{r:.2f}" for r in ratios)
            rows.append(f"| {cross} / {same} | {mode} | {paired:.2f}x | {medians:.2f}x | {each} | {verdict} |")
    if not rows:
        return []
    return [
        "",
        f"Across formats (goal: cross-format CPU per request <= {CROSS_GOAL:g}x the same-format path's):",
        "",
        "| cross / same | mode | median of paired ratios | ratio of medians | paired ratio per repetition | goal |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--kinds",
        nargs="+",
        choices=ALL_KINDS,
        help=f"clients to measure (default: {' '.join(KINDS)}; with --cross: {' '.join(CROSS_KINDS)})",
    )
    ap.add_argument(
        "--cross",
        action="store_true",
        help="capmon across formats: chat and messages() requests served on each wire (the four cross kinds)",
    )
    ap.add_argument(
        "--sdk",
        action="store_true",
        help="the openai SDK: alone, through capmon in process (async and sync) and at the gateway, "
        "against client.chat",
    )
    ap.add_argument("--modes", nargs="+", choices=MODES, default=MODES, help="plain and / or streaming requests")
    ap.add_argument("--profile", metavar="FILE", help="also profile one kind with cProfile; stats to FILE")
    ap.add_argument("--profile-kind", choices=ALL_KINDS, default="capmon-aiohttp")
    ap.add_argument("--profile-mode", choices=MODES, default="plain")
    ap.add_argument("--worker", choices=ALL_KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, default="plain", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    if args.worker:
        print(json.dumps(asyncio.run(measure(args.worker, args.mode, args.url, args.requests, args.concurrency))))
        return 0

    asked = args.kinds or (list(CROSS_KINDS) if args.cross else SDK_KINDS if args.sdk else KINDS)
    kinds = [k for k in ALL_KINDS if k in asked or (args.cross and k in CROSS_KINDS) or (args.sdk and k in SDK_KINDS)]
    modes = [m for m in MODES if m in args.modes]
    port = free_port()
    server = spawn([sys.executable, "-m", "benchmarks.overhead", "--serve", str(port)])
    try:
        wait_port(port, server, "the instant endpoint")
        base_url = f"http://127.0.0.1:{port}/v1"
        print(f"<!-- python -m benchmarks.overhead {' '.join(argv if argv is not None else sys.argv[1:])} -->")
        print(
            f"machine: {os.cpu_count()} cores; {args.requests} requests x {args.reps} reps per client and mode, "
            f"concurrency {args.concurrency}, after {WARMUP} warm-up requests; each run in a fresh process\n"
        )
        runs: dict[tuple[str, str], list[dict[str, float]]] = {(k, m): [] for k in kinds for m in modes}
        for rep in range(args.reps):
            order = kinds if rep % 2 == 0 else kinds[::-1]
            for mode in modes:
                for kind in order:
                    runs[(kind, mode)].append(_run_worker(kind, mode, base_url, args.requests, args.concurrency))
        print(report(runs, kinds, modes))
        if args.profile:
            print(f"\ncProfile of {args.profile_kind} ({args.profile_mode}; one run, sorted by own time):\n```")
            print(
                profile(args.profile_kind, args.profile_mode, base_url, args.requests, args.concurrency, args.profile)
            )
            print("```")
    finally:
        stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
