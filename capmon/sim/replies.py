"""What both APIs (chat completions and Responses) share on the wire: reading the key,
turning a refused request into its HTTP answer (or its in-stream rejection), and the
stream response that frees its slot however the stream ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from capmon.sim import dialects
from capmon.sim.dialects import Api, WireError, stream_api
from capmon.sim.model import Decision, NoCapacity, Penalised, Simulator, TooLong, UnknownModel, Unsupported


class BadRequest(Exception):
    """A request the simulator refuses with 400 before it reaches a model."""

    def __init__(self, message: str, param: str | None = None, model: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.model = model


def bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    # Azure and Anthropic clients send the key in their own headers.
    return request.headers.get("api-key") or request.headers.get("x-api-key") or None


def wire(err: WireError, extra: dict[str, str] | None = None) -> Response:
    return Response(
        err.body, status_code=err.status, media_type=err.media_type, headers={**err.headers, **(extra or {})}
    )


def simulator(request: Request) -> Simulator:
    sim: Simulator = request.app.state.simulator
    return sim


def refusal(
    decision: Decision, *, api: Api, stream: bool, in_stream: Callable[[str, str], AsyncIterator[bytes]] | None = None
) -> Response | None:
    """The answer to a request the simulator did not admit, or None when it was admitted or
    faulted. A full model whose dialect says "no" inside a stream of this API answers 200
    with ``in_stream(dialect, model)`` as the body; every other refusal is an HTTP error."""
    if isinstance(decision, Penalised):
        return wire(dialects.penalty_rejection(decision.remaining))
    if isinstance(decision, UnknownModel):
        return wire(dialects.model_not_found(decision.model))
    if isinstance(decision, Unsupported):
        return wire(dialects.unsupported_parameter(decision.dialect, decision.param, decision.instead))
    if isinstance(decision, TooLong):
        return wire(
            dialects.context_length_exceeded(decision.context_window, decision.prompt_tokens, decision.max_tokens)
        )
    if isinstance(decision, NoCapacity):
        s = decision.state
        if stream and in_stream is not None and stream_api(s.dialect) is api:
            return StreamingResponse(in_stream(s.dialect, s.name), media_type="text/event-stream")
        return wire(dialects.capacity_rejection(s.dialect, model=s.name, slots=s.slots, hint=s.hint))
    return None


class SlotStream(StreamingResponse):
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


P = TypeVar("P")  # what an endpoint parses its body into


async def read_request(
    request: Request, parse: Callable[[Any], P], unparsable: str
) -> tuple[Simulator, str, P] | Response:
    """An endpoint's first steps: the caller's key, then its JSON body parsed by ``parse``.
    A wrong key, a body that is not JSON (``unparsable`` says so) or one ``parse``
    refuses is the provider's error answer, counted as a bad request."""
    sim = simulator(request)
    token = bearer(request)
    alias = sim.authenticate(token)
    if alias is None:
        return wire(dialects.invalid_api_key(token))
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: deeply nested JSON
        sim.bad_request(alias)
        return wire(dialects.bad_request(unparsable))
    try:
        return sim, alias, parse(body)
    except BadRequest as e:
        sim.bad_request(alias, e.model)
        return wire(dialects.bad_request(str(e), e.param))
