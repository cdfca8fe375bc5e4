"""Hypothesis over the gateway's request parsing: bodies (JSON of any shape, NaN and
huge numbers spliced in, other encodings, raw bytes), the per-request headers and the
control API's event number. Whatever comes, the answer is never a 500, and every
refusal is the OpenAI error shape.

The gateway runs in-process (httpx's ASGITransport) in front of the simulator on a
loopback port, so requests that pass go all the way to a provider and back. A streamed
answer (an SSE event stream, a chat stream) is cut after its first chunk: the client
hangs up, as a real one may."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.gateway.helpers import Running, running, scenario, spec

ADMIN = "sk-gw-admin-0123456789abcdef"  # every request carries it, so the control API's actions parse their bodies too

PATHS = ("/v1/chat/completions", "/v1/responses", "/capmon/events", "/capmon/trip", "/capmon/pin")

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_part = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["text", "image_url"]) | _json, "text": _json})
_message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant", "tool"]) | _json,
        "content": st.text(max_size=20) | st.lists(_part, max_size=2) | _json,
        "name": _json,
        "tool_calls": _json,
        "tool_call_id": _json,
    },
)
_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["auto", "flagship", "gpt-9"]) | _json,
        "messages": st.lists(_message, max_size=3) | _json,
        "input": st.text(max_size=10) | st.lists(_message, max_size=2) | _json,
        "instructions": _json,
        "stream": st.booleans() | _json,
        "max_tokens": st.integers(-2, 64) | _json,
        "max_output_tokens": st.integers(-2, 64) | _json,
        "n": st.integers(0, 2) | _json,
        "temperature": _json,
        "target": st.sampled_from(["flagship", "nope"]) | _json,
        "reason": _json,
    },
)
# What JSON does not allow, spliced in where a value goes.
_splice = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "1_0", "0x10", "\ud800"])
_encoding = st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-32"])


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    kind = draw(st.sampled_from(["sound", "json", "json", "spliced", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    body = draw(_body)
    if kind == "sound":  # a request that may well be served (or acted on)
        if path.startswith("/capmon/"):
            body = {"target": draw(st.sampled_from(["flagship", "nope"])), "reason": draw(st.text(max_size=20))}
        else:
            body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "input": "hi"}
            body["stream"] = draw(st.booleans())
    if kind == "spliced":
        body["top_p"] = "SPLICE"
        text = json.dumps(body).replace('"SPLICE"', draw(_splice))
    else:
        text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    return text.encode(draw(_encoding), "surrogatepass")


# Header values as octets: what a client can put on the wire (servers decode latin-1).
_octets = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=12)
_number_like = st.sampled_from(["30", "2.5", "0", "-1", "1_0", "1e3", "nan", "inf", "²", "7" * 5000, " 5 ", ".5"])
_header = st.one_of(st.none(), st.none(), _number_like, _octets, st.sampled_from(["batch", "interactive", "BATCH"]))


SOUND = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _cut_streams(app: ASGIApp) -> ASGIApp:
    """The app, whose streamed answers end after their first chunk (the client hangs up)."""

    async def cut(scope: Scope, receive: Receive, send: Send) -> None:
        ended = False

        async def relay(message: Message) -> None:
            nonlocal ended
            if ended:
                return
            if message["type"] == "http.response.body" and message.get("more_body"):
                message, ended = {**message, "more_body": False}, True
            await send(message)

        await app(scope, receive, relay)

    return cut


@contextlib.asynccontextmanager
async def _gateway() -> AsyncIterator[tuple[Running, httpx.AsyncClient]]:
    fast = scenario(*(spec(m, base_latency=0.0) for m in ("flagship", "medium", "small")))
    async with running(
        fast,
        extra="[client]\nmax_attempts = 2\ndeadline = 5",
        gateway='admin_key_env = "GW_ADMIN"',
        environ={"GW_ADMIN": ADMIN},
    ) as gw:
        transport = httpx.ASGITransport(app=_cut_streams(gw.app), raise_app_exceptions=False)
        auth = {"authorization": f"Bearer {ADMIN}", "content-type": "application/json"}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=auth) as http:
            yield gw, http


def _check(r: httpx.Response, sent: str) -> None:
    assert r.status_code != 500 and r.status_code < 600, sent
    if r.status_code >= 400:
        assert r.headers["content-type"] == "application/json", sent
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str), sent


def test_the_gateways_request_parsing_never_answers_500_and_refuses_in_the_openai_shape() -> None:
    with asyncio.Runner() as runner:
        stack = contextlib.AsyncExitStack()
        gw, http = runner.run(stack.enter_async_context(_gateway()))
        try:
            # What the attacks of issue 16 found, always tried first.
            @example(("/capmon/events", b""), False, None, None, None, "7" * 5000)
            @example(("/capmon/events", b""), False, None, None, "\xb2", None)
            @example(("/v1/chat/completions", SOUND.replace(b"[", b"[NaN, ", 1)), True, None, None, None, None)
            @example(("/v1/chat/completions", SOUND.decode().encode("utf-16")), False, "1_0", None, None, None)
            @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(
                path_and_body=st.sampled_from(PATHS).flatmap(lambda p: st.tuples(st.just(p), bodies(p))),
                plain=st.booleans(),  # half the requests carry none of the headers and queries
                deadline=_header,
                priority=_header,
                last_event_id=_header,
                since=st.one_of(st.none(), _number_like, st.text(max_size=8)),
            )
            def one(
                path_and_body: tuple[str, bytes],
                plain: bool,
                deadline: Any,
                priority: Any,
                last_event_id: Any,
                since: str | None,
            ) -> None:
                path, body = path_and_body
                if plain:
                    deadline = priority = last_event_id = since = None
                headers = {
                    name: value.encode("latin-1")
                    for name, value in (
                        ("x-capmon-deadline", deadline),
                        ("x-capmon-priority", priority),
                        ("last-event-id", last_event_id),
                    )
                    if value is not None
                }
                params = {"since": since} if since is not None else {}
                method = "GET" if path == "/capmon/events" else "POST"
                sent = f"{method} {path} {params} {headers} {body[:200]!r}"
                r = runner.run(http.request(method, path, content=body, headers=headers, params=params))
                _check(r, sent)

            one()
        finally:
            runner.run(stack.aclose())
        assert gw.client.snapshot().requests > 0  # some requests did reach the provider
