"""What every API (chat completions, Responses, Messages) shares on the wire: reading the
key, turning a refused request into its HTTP answer in the wire's own shape (or its
in-stream rejection), and the stream response that frees its slot however the stream ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from capmon.core.base.clock import Clock
from capmon.core.providers import aws_sigv4 as sigv4
from capmon.sim import dialects
from capmon.sim.dialects import AZURE_API_VERSION, Api, Wire, WireError, speaks
from capmon.sim.faults import HANG_SECONDS, HTML_500_PAGE, PACED, STREAMED, DropConnection, FaultMode, delayed
from capmon.sim.model import (
    Decision,
    Faulted,
    NoCapacity,
    Penalised,
    Simulator,
    Ticket,
    TooLong,
    UnknownModel,
    Unsupported,
)
from capmon.sim.tools import ToolCall


@dataclass(frozen=True)
class Via:
    """How a request reached an OpenAI handler: OpenAI's own URLs, or Azure's (where a
    classic URL's ``deployment`` names the model and ``api_version`` is the query's)."""

    wire: Wire = Wire.OPENAI
    deployment: str | None = None
    api_version: str | None = None

    def body(self, body: Any) -> Any:
        """The body as the handler reads it: an Azure deployment URL overrides its model."""
        if self.deployment is not None and isinstance(body, dict):
            return {**body, "model": self.deployment}
        return body


OPENAI_VIA = Via()


class BadRequest(Exception):
    """A request the simulator refuses with 400 before it reaches a model."""

    def __init__(self, message: str, param: str | None = None, model: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.model = model


def bearer(request: Request, wire: Wire = Wire.OPENAI) -> str | None:
    """The caller's key: ``Authorization: Bearer``, or Azure's ``api-key`` / Anthropic's
    ``x-api-key``. On Anthropic's wire ``x-api-key`` wins when both are sent, as there. The
    Gemini API takes ``x-goog-api-key`` or ``?key=``; Vertex AI an OAuth token as Bearer (or
    an express-mode key in ``x-goog-api-key``); Bedrock a SigV4 signature, whose access key id
    is the key (capmon/core/providers/aws_sigv4.py checks the signature), or a Bedrock API key as Bearer."""
    if wire is Wire.BEDROCK:
        signed = sigv4.parse(request.headers.get("authorization", ""))
        if signed is not None:
            return signed.access_key
    google_key = request.headers.get("x-goog-api-key") or None
    if wire is Wire.GEMINI:
        return google_key or request.query_params.get("key") or None
    anthropic_key = request.headers.get("x-api-key") or None
    if wire is Wire.ANTHROPIC and anthropic_key:
        return anthropic_key
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if wire is Wire.VERTEX:
        return google_key
    if wire is Wire.BEDROCK:
        return None
    return request.headers.get("api-key") or anthropic_key


def wire(err: WireError, extra: dict[str, str] | None = None) -> Response:
    return Response(
        err.body, status_code=err.status, media_type=err.media_type, headers={**err.headers, **(extra or {})}
    )


def simulator(request: Request) -> Simulator:
    sim: Simulator = request.app.state.simulator
    return sim


def rejection(
    decision: Decision,
    *,
    api: Api,
    stream: bool,
    in_stream: Callable[[str, str], AsyncIterator[bytes]] | None = None,
    on: Wire = Wire.OPENAI,
    now: float = 0.0,
    api_version: str | None = None,
    headers: dict[str, str] | None = None,
    stream_type: str = "text/event-stream",
) -> Response | None:
    """The answer to a request the simulator did not admit, or None when it was admitted or
    faulted. A full model whose dialect says "no" inside a stream of this API answers 200
    with ``in_stream(dialect, model)`` as the body; every other refusal is an HTTP error,
    in the shape of the wire ``on`` except for a full model (its dialect says how). ``now``
    (wall clock) and ``api_version`` (Azure's) fill the rejections that carry them;
    ``stream_type`` is the in-stream rejection's media type."""
    if isinstance(decision, Penalised):
        return wire(dialects.penalty_rejection(decision.remaining, on), headers)
    if isinstance(decision, UnknownModel):
        return wire(dialects.model_not_found(decision.model, on), headers)
    if isinstance(decision, Unsupported):
        return wire(dialects.unsupported_parameter(decision.dialect, decision.param, decision.instead), headers)
    if isinstance(decision, TooLong):
        return wire(
            dialects.context_length_exceeded(decision.context_window, decision.prompt_tokens, decision.max_tokens, on),
            headers,
        )
    if isinstance(decision, NoCapacity):
        s = decision.state
        if stream and in_stream is not None and speaks(s.dialect, api):
            return StreamingResponse(in_stream(s.dialect, s.name), media_type=stream_type, headers=headers)
        return wire(
            dialects.capacity_rejection(
                s.dialect,
                model=s.name,
                slots=s.slots,
                hint=s.hint,
                now=now,
                api_version=api_version or AZURE_API_VERSION,
                context_window=s.context_window,
            ),
            headers,
        )
    return None


async def hold(sim: Simulator, ticket: Ticket) -> None:
    """A plain answer's work: hold the slot for the service time, then free it (as
    cancelled when the client went away first)."""
    completed = False
    try:
        await sim.clock.sleep(ticket.service_time)
        completed = True
    finally:
        sim.release(ticket, completed=completed)


class SlotStream(StreamingResponse):
    """A stream that frees its slot however it ends: finished, cut, or the client gone
    (even before the body started, when the generator's own ``finally`` would never run)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        release: Callable[[bool], None],
        headers: dict[str, str],
        media_type: str = "text/event-stream",
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            await super().__call__(scope, receive, send)
            completed = True
        finally:
            self._release(completed)


P = TypeVar("P")  # what an endpoint parses its body into


async def read_request(
    request: Request,
    parse: Callable[[Any], P],
    unparsable: str,
    on: Wire = Wire.OPENAI,
    headers: dict[str, str] | None = None,
) -> tuple[Simulator, str, P] | Response:
    """An endpoint's first steps: the caller's key, then its JSON body parsed by ``parse``.
    A wrong key, a body that is not JSON (``unparsable`` says so) or one ``parse``
    refuses is the provider's error answer (in wire ``on``'s shape), counted as a bad request."""
    sim = simulator(request)
    token = bearer(request, on)
    alias = sim.authenticate(token)
    if alias is None:
        return wire(dialects.invalid_api_key(token, on), headers)
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: deeply nested JSON
        sim.bad_request(alias)
        return wire(dialects.bad_request(unparsable, wire=on), headers)
    try:
        return sim, alias, parse(body)
    except BadRequest as e:
        sim.bad_request(alias, e.model)
        return wire(dialects.bad_request(str(e), e.param, on), headers)


async def faulted(
    sim: Simulator,
    decision: Faulted,
    *,
    stream: bool,
    call: ToolCall | None,
    broken: ToolCall | None,
    streamed: Callable[[Clock, ToolCall | None], AsyncIterator[bytes]],
    answer: Callable[[ToolCall | None], bytes],
    on: Wire,
    headers: dict[str, str],
    stream_type: str = "text/event-stream",
) -> Response | DropConnection:
    """A faulted request's answer, for an API whose faults are the common ones (chat
    completions' huge body is its own). ``streamed(clock, call)``: the API's stream, timed by
    ``clock``, broken as the rule says; ``answer(call)``: its whole plain answer (a text
    answer when ``call`` is None); ``call``: the call the request would get, ``broken``: the
    broken_tool_args fault's."""
    rule, ticket = decision.rule, decision.ticket
    if rule.mode in STREAMED or (broken is not None and stream) or (rule.mode in PACED and stream):
        return StreamingResponse(
            streamed(rule.clock(sim.clock), broken or call), media_type=stream_type, headers=headers
        )
    if rule.mode is FaultMode.SLOW_FIRST_TOKEN:  # headers now, the answer (its first token) later
        body = answer(call)
        return StreamingResponse(delayed(sim.clock, rule.seconds, body), media_type="application/json", headers=headers)
    if rule.mode is FaultMode.HANG:
        await sim.clock.sleep(HANG_SECONDS)
        return PlainTextResponse("Gateway Timeout", status_code=504)
    if rule.mode is FaultMode.ERROR:
        return wire(dialects.status_error(rule.status, on), headers)
    await sim.clock.sleep(ticket.first_token)
    if broken is not None:
        return Response(answer(broken), media_type="application/json", headers=headers)
    if rule.mode is FaultMode.RESET:
        return DropConnection()
    if rule.mode is FaultMode.TRUNCATE:
        body = answer(None)
        return Response(body[: len(body) // 2], media_type="application/json", headers=headers)
    if rule.mode is FaultMode.INVALID_JSON:
        return Response(b"not json", media_type="application/json", headers=headers)
    return HTMLResponse(HTML_500_PAGE, status_code=500)
