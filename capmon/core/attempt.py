"""One attempt on one target: send the request, read the answer within the caps, and
say what came back. No routing here: the router decides what an outcome means.

A plain attempt returns an :class:`Answer`. A streaming attempt is an async iterator
of the provider's chunks that holds back everything until the first chunk with
output (content, a tool call, a refusal or a finish reason), so that an error that
arrives before any output can still be retried elsewhere without the caller ever
seeing it; after output, an error ends the stream (``Answer.output_sent``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from capmon.core.config import Config
from capmon.core.errors import (
    QUOTA_HINT,
    Failure,
    Kind,
    classify_event,
    classify_exception,
    classify_response,
    parse_completion,
)
from capmon.core.result import Api, Attempt, ChatRequest, ChatResult
from capmon.core.transport import Sender
from capmon.core.wire import (
    Assembler,
    FrameKind,
    Oversized,
    SSEParser,
    TokenParam,
    chat_body,
    completion_text,
    oversized_failure,
    parse_response,
    read_capped,
    read_frame,
    read_responses_frame,
    response_text,
    responses_body,
)

if TYPE_CHECKING:
    from capmon.core.targets import Target


@dataclass
class Answer:
    status: int | None = None
    failure: Failure | None = None
    response: Mapping[str, Any] | None = None
    output_sent: bool = False  # a stream's output reached the caller: a failure now cannot be retried


def result_of(
    answer: Answer, t: Target, api: Api, attempts: tuple[Attempt, ...], latency: float, request_id: int
) -> ChatResult:
    """A successful answer as the caller gets it: which target served, its text, its usage."""
    response = answer.response or {}
    usage = response.get("usage") or {}
    return ChatResult(
        model=t.model.name,
        endpoint=t.endpoint.name,
        target=t.id,
        content=response_text(response) if api is Api.RESPONSES else completion_text(response),
        response=response,
        attempts=attempts,
        latency=latency,
        usage=usage if isinstance(usage, Mapping) else {},
        request_id=request_id,
    )


@dataclass(frozen=True, slots=True)
class Request:
    target: Target
    body: Mapping[str, Any]
    timeout: float  # seconds the whole attempt may take, a stream's reads after its first output included
    cap: int  # bytes the answer may take
    quota_hint: float = QUOTA_HINT  # a hint this long means a quota ([backoff] max_hint)
    api: Api = Api.CHAT


def chat_request(
    t: Target,
    request: ChatRequest,
    token_param: TokenParam,
    config: Config,
    stream: bool,
    *,
    time_left: float | None = None,
) -> Request:
    """The request one attempt sends to ``t``: the caller's fields, this model's cap, and
    ``[client] attempt_timeout`` cut to the request's ``time_left`` (seconds)."""
    cap = t.model.max_tokens
    limit = min(request.max_tokens or cap, cap)
    if request.api is Api.RESPONSES:
        body = responses_body(request.extra, model=t.model.wire_name, max_output_tokens=limit, stream=stream)
    else:
        body = chat_body(
            request.messages,
            request.extra,
            model=t.model.wire_name,
            token_param=token_param,
            max_tokens=limit,
            temperature=request.temperature,
            stream=stream,
        )
    timeout = config.client.attempt_timeout if time_left is None else min(config.client.attempt_timeout, time_left)
    return Request(t, body, max(0.0, timeout), config.client.max_response_bytes, config.backoff.max_hint, request.api)


def _failed_response(status: int, headers: Any, body: bytes, wall: float, quota_hint: float) -> Failure:
    try:
        obj = json.loads(body)
    except Exception:
        obj = None
    if isinstance(obj, Mapping) and obj.get("object") == "response" and obj.get("status") == "failed":
        return classify_event(
            {"type": "response.failed", "response": obj}, "response.failed", now=wall, quota_hint=quota_hint
        )
    failure = classify_response(status, headers, body, now=wall, quota_hint=quota_hint)
    return failure or Failure(Kind.TRANSIENT, f"{status} with no finished response", status)


def _build(http: Sender, req: Request) -> httpx.Request:
    url = req.target.responses_url if req.api is Api.RESPONSES else req.target.http_url
    return http.request(url, req.target.http_headers, json.dumps(req.body).encode())


async def plain(http: Sender, req: Request, *, wall: float) -> Answer:
    """Send a non-streaming request; every failure is classified, never raised (but
    cancellation)."""
    answer = Answer()
    try:
        async with asyncio.timeout(req.timeout):
            resp = await http.send(_build(http, req))
            try:
                answer.status = resp.status_code
                try:
                    body = await read_capped(resp, req.cap)
                except Oversized:
                    answer.failure = oversized_failure(req.cap, resp.status_code, streaming=False)
                    return answer
            finally:
                await resp.aclose()
        if req.api is Api.RESPONSES:
            parsed = parse_response(resp.status_code, body)
            if parsed is None and 200 <= resp.status_code < 300:
                # A 200 that is no finished response: a failed one says why, like its stream would.
                answer.failure = _failed_response(resp.status_code, resp.headers, body, wall, req.quota_hint)
        else:
            parsed = parse_completion(resp.status_code, body)
        if parsed is not None:
            answer.response = parsed
        elif answer.failure is None:
            answer.failure = classify_response(
                resp.status_code, resp.headers, body, now=wall, quota_hint=req.quota_hint
            )
    except asyncio.CancelledError:
        raise
    except Exception as e:  # timeouts, resets, broken bodies: classified
        answer.status = None  # no whole answer came back
        answer.failure = classify_exception(e)
    return answer


# After [DONE] the body's end is read, so the connection goes back to the pool and the
# readers finish instead of being left to the garbage collector (which closes each async
# generator through a task of its own). A server that keeps the stream open after
# [DONE] gets this long, then loses the connection.
_DRAIN_SECONDS = 0.25
_DRAIN_BYTES = 65536


async def _drain(pieces: AsyncIterator[bytes], seconds: float) -> None:
    size = 0
    try:
        async with asyncio.timeout(seconds):
            async for piece in pieces:
                size += len(piece)
                if size > _DRAIN_BYTES:
                    return
    except (TimeoutError, httpx.HTTPError):
        return


@dataclass
class Stream:
    """A streaming attempt. Iterate :meth:`chunks` for the provider's chunks; ``answer``
    says how it ended once iteration stops. Closing the iterator early (``aclose()``)
    releases the connection."""

    http: Sender
    req: Request
    clock_now: Any  # () -> float, the loop's clock
    wall: float
    answer: Answer = field(default_factory=Answer)
    assembler: Assembler = field(default_factory=Assembler)

    async def chunks(self) -> AsyncIterator[Mapping[str, Any]]:
        answer = self.answer
        deadline = self.clock_now() + self.req.timeout
        resp: httpx.Response | None = None
        held: list[Mapping[str, Any]] = []
        try:
            async with asyncio.timeout(max(0.0, deadline - self.clock_now())):
                resp = await self.http.send(_build(self.http, self.req))
            answer.status = resp.status_code
            if resp.status_code >= 300:
                async with asyncio.timeout(max(0.0, deadline - self.clock_now())):
                    try:
                        body = await read_capped(resp, min(self.req.cap, 1 << 20))
                    except Oversized:
                        body = b""
                answer.failure = classify_response(
                    resp.status_code, resp.headers, body, now=self.wall, quota_hint=self.req.quota_hint
                )
                return
            parser = SSEParser()
            responses = self.req.api is Api.RESPONSES
            reader = read_responses_frame if responses else read_frame
            final: Any = None
            size = 0
            done = finished = False
            pieces = resp.aiter_bytes()
            while not done:
                # The deadline guards the reads only: a timeout scope around a yield would
                # cancel the caller's own work between chunks.
                async with asyncio.timeout(max(0.0, deadline - self.clock_now())):
                    try:
                        piece = await pieces.__anext__()
                    except StopAsyncIteration:
                        piece = None
                if piece is None:
                    frames = parser.close()
                    done = True
                else:
                    size += len(piece)
                    if size > self.req.cap:
                        answer.failure = oversized_failure(self.req.cap, resp.status_code, streaming=True)
                        return
                    frames = parser.feed(piece)
                for frame in frames:
                    event = reader(frame, now=self.wall, quota_hint=self.req.quota_hint)
                    kind = event.kind
                    if kind is FrameKind.DONE and event.chunk is not None:
                        # The Responses API's last event is the answer; it goes to the caller too.
                        final = event.chunk.get("response")
                        for c in held:
                            yield c
                        held.clear()
                        answer.output_sent = True
                        yield event.chunk
                    if kind is FrameKind.CHUNK:
                        assert event.chunk is not None
                        if not responses:
                            self.assembler.add(event.chunk)
                            if self.assembler.finish_reason:
                                finished = True
                        if answer.output_sent:
                            yield event.chunk
                        elif event.output:
                            answer.output_sent = True
                            for c in held:
                                yield c
                            held.clear()
                            yield event.chunk
                        else:
                            held.append(event.chunk)
                    elif kind is FrameKind.DONE:
                        finished = done = True
                        await _drain(pieces, min(_DRAIN_SECONDS, max(0.0, deadline - self.clock_now())))
                        break
                    elif kind in (FrameKind.ERROR, FrameKind.BROKEN):
                        answer.failure = event.failure
                        return
            if not finished:
                answer.failure = Failure(Kind.TRANSIENT, "stream ended before [DONE]", resp.status_code)
                return
            for c in held:  # an answer with no output at all (rare, but complete)
                yield c
            answer.response = final if responses and isinstance(final, Mapping) else self.assembler.completion()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # timeouts, resets mid-stream: classified
            answer.failure = classify_exception(e)
        finally:
            if resp is not None:
                await resp.aclose()
