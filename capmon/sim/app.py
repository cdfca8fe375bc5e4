"""The simulated provider as an ASGI app: an OpenAI-compatible chat API that really runs
out of capacity, plus admin endpoints to steer it.

API (OpenAI format; key as ``Authorization: Bearer KEY``, ``api-key`` or ``x-api-key``):
  POST /v1/chat/completions   plain JSON, or SSE when "stream": true
  GET  /v1/models, /v1/models/{name}

Admin (NO AUTH: the simulator is meant to listen on loopback only; do not expose it):
  GET    /admin/stats                 counters: totals, per model, per key (keys by hash)
  POST   /admin/reset                 zero the counters (live requests stay counted)
  GET    /admin/models/{name}         the model's state right now
  POST   /admin/models/{name}         {"slots": 0} {"latency_factor": 3} {"hint": 2.0 | null}
                                      {"dialect": "openai-503"} {"reset_schedule": true}
  POST   /admin/outage/{name}         {"duration": 30, "dialect": "capacity-text"?}
  GET    /admin/faults                the active fault rules
  POST   /admin/faults                {"mode": "reset", "count": 2} | {"mode": "hang", "rate": 0.1}
                                      | {"mode": ..., "model": "sim-small", ...} | a list | {"mode": "off"}
  DELETE /admin/faults                switch faults off

Every response carries ``x-capmon-simulator: <scenario>`` so a probe can tell the
simulator from something else listening on the port.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capmon.core.clock import Clock
from capmon.sim import dialects
from capmon.sim.dialects import WireError
from capmon.sim.faults import HANG_SECONDS, HTML_500_PAGE, DropConnection, FaultMode, parse_rules
from capmon.sim.model import (UNSET, Admitted, Faulted, NoCapacity, Penalised, Simulator, Ticket, TooLong,
                              UnknownModel)
from capmon.sim.scenario import Scenario, load_scenario

SIM_HEADER = "x-capmon-simulator"
STREAM_CHUNK_TOKENS = 4  # tokens per SSE chunk: realistic enough, far fewer events than one per token
FINGERPRINT = "fp_capmon_sim"

_WORDS = (
    "The simulated provider answers with steady text so that a client can count tokens, check streams "
    "and compare replies. Capacity is finite: when every slot of a model is busy the next request is "
    "rejected at once, and a careful client backs off, waits for the hint, or falls back to another "
    "model that still has room. Batches keep going, breakers open and close, and the dashboard shows "
    "which model served every item."
).split()


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class ChatRequest:
    model: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, model: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.model = model


def estimate_tokens(messages: list[Any]) -> int:
    """chars / 4 over all text in the messages, rounded up."""
    chars = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    chars += len(part["text"])
    return math.ceil(chars / 4)


def parse_chat(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise _BadRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _BadRequest("you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _BadRequest("'messages' must be a non-empty array of message objects.", "messages", model)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise _BadRequest(f"Invalid 'max_tokens': expected an integer >= 1, got {max_tokens!r}.", "max_tokens", model)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _BadRequest(f"Invalid 'stream': expected a boolean, got {stream!r}.", "stream", model)
    options = body.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    return ChatRequest(model, estimate_tokens(messages), max_tokens, stream, include_usage)


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    # Azure and Anthropic clients send the key in their own headers.
    return request.headers.get("api-key") or request.headers.get("x-api-key") or None


# ---------------------------------------------------------------- answers


def answer_text(ticket: Ticket) -> list[str]:
    """``completion_tokens`` words (one token each), starting somewhere different per request."""
    start = ticket.id * 7 % len(_WORDS)
    return [_WORDS[(start + i) % len(_WORDS)] for i in range(ticket.completion_tokens)]


def _wire(err: WireError, extra: dict[str, str] | None = None) -> Response:
    return Response(err.body, status_code=err.status, media_type=err.media_type, headers={**err.headers, **(extra or {})})


def _completion(ticket: Ticket, created: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-sim{ticket.id:010d}",
        "object": "chat.completion",
        "created": created,
        "model": ticket.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": " ".join(answer_text(ticket)), "refusal": None},
            "logprobs": None,
            "finish_reason": ticket.finish_reason,
        }],
        "usage": _usage(ticket),
    }


def _usage(ticket: Ticket) -> dict[str, int]:
    return {"prompt_tokens": ticket.prompt_tokens, "completion_tokens": ticket.completion_tokens,
            "total_tokens": ticket.prompt_tokens + ticket.completion_tokens}


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def _stream(clock: Clock, ticket: Ticket, created: int, include_usage: bool, cut: bool) -> AsyncIterator[bytes]:
    base = {"id": f"chatcmpl-sim{ticket.id:010d}", "object": "chat.completion.chunk", "created": created,
            "model": ticket.model, "system_fingerprint": FINGERPRINT}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        payload = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            payload["usage"] = None
        return _sse(payload)

    words = answer_text(ticket)
    pieces = [words[i:i + STREAM_CHUNK_TOKENS] for i in range(0, len(words), STREAM_CHUNK_TOKENS)]
    await clock.sleep(ticket.first_token)
    yield chunk({"role": "assistant", "content": "", "refusal": None})
    for i, piece in enumerate(pieces):
        if cut and i >= len(pieces) // 2:
            return  # the stream just stops: no finish_reason, no [DONE]
        await clock.sleep(ticket.per_token * len(piece))
        yield chunk({"content": (" " if i else "") + " ".join(piece)})
    yield chunk({}, ticket.finish_reason)
    if include_usage:
        yield _sse({**base, "choices": [], "usage": _usage(ticket)})
    yield b"data: [DONE]\n\n"


class _SlotStream(StreamingResponse):
    """A stream that frees its slot however it ends: finished, cut, or the client gone
    (even before the body started, when the generator's own ``finally`` would never run)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[bool], None], headers: dict[str, str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            await super().__call__(scope, receive, send)
            completed = True
        finally:
            self._release(completed)


# ---------------------------------------------------------------- endpoints


def _sim(request: Request) -> Simulator:
    return request.app.state.simulator


async def chat_completions(request: Request) -> Response:
    sim = _sim(request)
    token = _bearer(request)
    alias = sim.authenticate(token)
    if alias is None:
        return _wire(dialects.invalid_api_key(token))
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: deeply nested JSON
        sim.bad_request(alias)
        return _wire(dialects.bad_request(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
            "HTTP library correctly. The OpenAI API expects a JSON payload.)"))
    try:
        chat = parse_chat(body)
    except _BadRequest as e:
        sim.bad_request(alias, e.model)
        return _wire(dialects.bad_request(str(e), e.param))

    decision = sim.submit(alias, chat.model, prompt_tokens=chat.prompt_tokens, max_tokens=chat.max_tokens,
                          stream=chat.stream)
    if isinstance(decision, Penalised):
        return _wire(dialects.penalty_rejection(decision.remaining))
    if isinstance(decision, UnknownModel):
        return _wire(dialects.model_not_found(decision.model))
    if isinstance(decision, TooLong):
        return _wire(dialects.context_length_exceeded(decision.context_window, decision.prompt_tokens,
                                                      decision.max_tokens))
    if isinstance(decision, NoCapacity):
        s = decision.state
        return _wire(dialects.capacity_rejection(s.dialect, model=s.name, slots=s.slots, hint=s.hint))
    if isinstance(decision, Faulted):
        return await _faulted(sim, decision, chat)
    assert isinstance(decision, Admitted)
    ticket = decision.ticket
    headers = {"x-request-id": f"req_{secrets.token_hex(12)}"}
    created = int(sim.clock.wall())
    if chat.stream:
        return _SlotStream(_stream(sim.clock, ticket, created, chat.include_usage, cut=False),
                           lambda done: sim.release(ticket, completed=done), headers)
    completed = False
    try:
        await sim.clock.sleep(ticket.service_time)
        completed = True
    finally:
        sim.release(ticket, completed=completed)
    return JSONResponse(_completion(ticket, created), headers=headers)


async def _faulted(sim: Simulator, decision: Faulted, chat: ChatRequest) -> Any:
    mode, ticket = decision.mode, decision.ticket
    created = int(sim.clock.wall())
    if mode is FaultMode.STREAM_CUT:
        return StreamingResponse(_stream(sim.clock, ticket, created, chat.include_usage, cut=True),
                                 media_type="text/event-stream")
    if mode is FaultMode.HANG:
        await sim.clock.sleep(HANG_SECONDS)
        return PlainTextResponse("Gateway Timeout", status_code=504)
    await sim.clock.sleep(ticket.first_token)
    if mode is FaultMode.RESET:
        return DropConnection()
    if mode is FaultMode.TRUNCATE:
        body = json.dumps(_completion(ticket, created)).encode()
        return Response(body[: len(body) // 2], media_type="application/json")
    if mode is FaultMode.INVALID_JSON:
        return Response(b"not json", media_type="application/json")
    return HTMLResponse(HTML_500_PAGE, status_code=500)


def _model_entry(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "capmon-sim"}


async def list_models(request: Request) -> Response:
    sim = _sim(request)
    token = _bearer(request)
    if not sim.is_accepted(token):
        return _wire(dialects.invalid_api_key(token))
    created = int(sim.clock.wall())
    return JSONResponse({"object": "list", "data": [_model_entry(n, created) for n in sim.model_names()]})


async def get_model(request: Request) -> Response:
    sim = _sim(request)
    token = _bearer(request)
    if not sim.is_accepted(token):
        return _wire(dialects.invalid_api_key(token))
    name = request.path_params["name"]
    if not sim.has_model(name):
        return _wire(dialects.model_not_found(name))
    return JSONResponse(_model_entry(name, int(sim.clock.wall())))


# ---------------------------------------------------------------- admin


def _admin_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


async def _admin_body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise _BadRequest("the body must be JSON") from None


def _state_json(sim: Simulator, name: str) -> dict[str, Any]:
    state = sim.state(name)
    return {**dataclasses.asdict(state), "free": state.free, "overrides": list(state.overrides)}


async def admin_stats(request: Request) -> Response:
    return JSONResponse(_sim(request).stats())


async def admin_reset(request: Request) -> Response:
    sim = _sim(request)
    sim.reset_counters()
    return JSONResponse(sim.stats())


async def admin_model(request: Request) -> Response:
    sim = _sim(request)
    name = request.path_params["name"]
    if not sim.has_model(name):
        return _admin_error(404, f"no model named {name!r}; known: {', '.join(sim.model_names())}")
    if request.method == "GET":
        return JSONResponse(_state_json(sim, name))
    try:
        body = await _admin_body(request)
        if not isinstance(body, dict):
            raise _BadRequest("expected a JSON object")
        allowed = {"slots", "latency_factor", "hint", "dialect", "reset_schedule"}
        unknown = set(body) - allowed
        if unknown:
            raise _BadRequest(f"unknown field(s) {', '.join(sorted(unknown))}; expected {', '.join(sorted(allowed))}")
        sim.configure(name, slots=body.get("slots", UNSET), latency_factor=body.get("latency_factor", UNSET),
                      hint=body.get("hint", UNSET), dialect=body.get("dialect", UNSET),
                      reset_schedule=bool(body.get("reset_schedule", False)))
    except (_BadRequest, ValueError) as e:
        return _admin_error(400, str(e))
    return JSONResponse(_state_json(sim, name))


async def admin_outage(request: Request) -> Response:
    sim = _sim(request)
    name = request.path_params["name"]
    if not sim.has_model(name):
        return _admin_error(404, f"no model named {name!r}; known: {', '.join(sim.model_names())}")
    try:
        body = await _admin_body(request)
        if not isinstance(body, dict):
            raise _BadRequest("expected a JSON object")
        sim.outage(name, body.get("duration", 30.0), body.get("dialect"))
    except (_BadRequest, ValueError) as e:
        return _admin_error(400, str(e))
    return JSONResponse(_state_json(sim, name))


async def admin_faults(request: Request) -> Response:
    sim = _sim(request)
    if request.method == "DELETE":
        sim.faults.clear()
    elif request.method == "POST":
        try:
            sim.faults.set(parse_rules(await _admin_body(request)))
        except (_BadRequest, ValueError) as e:
            return _admin_error(400, str(e))
    return JSONResponse({"faults": sim.faults.snapshot()})


async def index(request: Request) -> Response:
    sim = _sim(request)
    return PlainTextResponse(
        f"capmon simulated provider, scenario {sim.scenario.name!r}. "
        f"OpenAI API under /v1 (models: {', '.join(sim.model_names())}); admin under /admin (no auth: loopback only).\n")


# ---------------------------------------------------------------- app


class _TagResponses:
    """Adds ``x-capmon-simulator`` to every response (pure ASGI, so streams stay streams)."""

    def __init__(self, app: ASGIApp, name: str) -> None:
        self.app = app
        # A header value must be printable latin-1: anything else would make every answer fail.
        value = "".join(ch if ch.isprintable() and ord(ch) < 256 else "?" for ch in name)
        self.header = (SIM_HEADER.encode(), value.encode("latin-1"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, tagged)


def create_app(scenario: Scenario | str | os.PathLike[str] = "demo", *, clock: Clock | None = None,
               simulator: Simulator | None = None) -> Starlette:
    """The simulator app. ``scenario`` is a Scenario, a bundled name or a path; ``clock``
    defaults to loop time, so a fast-forwarded loop fast-forwards the simulator too."""
    if simulator is None:
        scn = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        simulator = Simulator(scn, clock)
    routes = [
        Route("/", index),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models),
        Route("/v1/models/{name:path}", get_model),
        Route("/admin/stats", admin_stats),
        Route("/admin/reset", admin_reset, methods=["POST"]),
        Route("/admin/models/{name:path}", admin_model, methods=["GET", "POST"]),
        Route("/admin/outage/{name:path}", admin_outage, methods=["POST"]),
        Route("/admin/faults", admin_faults, methods=["GET", "POST", "DELETE"]),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(_TagResponses, name=simulator.scenario.name)])
    app.state.simulator = simulator
    return app


def simulator_of(app: Starlette) -> Simulator:
    return app.state.simulator


__all__ = ["ChatRequest", "SIM_HEADER", "create_app", "estimate_tokens", "parse_chat", "simulator_of"]
