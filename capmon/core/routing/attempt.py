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

from capmon.core.base.exceptions import BrokenAnswer
from capmon.core.providers import formats
from capmon.core.providers.classify import QUOTA_HINT, classify_exception, classify_response
from capmon.core.providers.frames import FrameKind
from capmon.core.providers.token_param import TokenParam
from capmon.core.routing.capped import Oversized, body_pieces, oversized_failure, read_capped
from capmon.core.routing.reads import Cut, ReadDeadline
from capmon.core.routing.targets import token_limit
from capmon.core.routing.transport import Sender
from capmon.core.types.config import Config
from capmon.core.types.failure import FIRST_TOKEN, SILENT, STALLED, Failure, Kind
from capmon.core.types.result import Attempt, ChatResult, Format, Request

if TYPE_CHECKING:
    from capmon.core.routing.targets import Target


@dataclass
class Answer:
    status: int | None = None
    failure: Failure | None = None
    response: Mapping[str, Any] | None = None
    output_sent: bool = False  # a stream's output reached the caller: a failure now cannot be retried
    wire: Format = Format.CHAT  # the format the attempt sent (the answer is in the caller's)
    dropped: tuple[str, ...] = ()  # fields left out because the target's API version refuses them


def result_of(
    answer: Answer,
    t: Target,
    api: Format,
    attempts: tuple[Attempt, ...],
    latency: float,
    request_id: int,
    requested: str = "",
    lowered: int | None = None,
    cost: float | None = None,
) -> ChatResult:
    """A successful answer as the caller gets it: which target served, its text, its usage
    and its ``cost`` (the serving attempt's)."""
    response = answer.response or {}
    usage = response.get("usage") or {}
    return ChatResult(
        model=t.model.name,
        endpoint=t.endpoint.name,
        deployment=t.deployment,
        target=t.id,
        content=formats.text_of(api, response),
        response=response,
        attempts=attempts,
        latency=latency,
        usage=usage if isinstance(usage, Mapping) else {},
        request_id=request_id,
        api=t.endpoint.api,
        requested=requested,
        max_tokens_lowered=lowered,
        cost=cost,
    )


@dataclass(frozen=True, slots=True)
class Sending:
    """What one attempt sends: the body in the target's wire, and the bounds it is read within."""

    target: Target
    body: Mapping[str, Any]
    timeout: float  # seconds the whole attempt may take, a stream's reads after its first output included
    cap: int  # bytes the answer may take
    quota_hint: float = QUOTA_HINT  # a hint this long means a quota ([backoff] max_hint)
    api: Format = Format.CHAT  # the format sent (the target's wire)
    dropped: tuple[str, ...] = ()
    request: Request | None = None  # the caller's request (None: a probe, answered in its own wire)
    lowered: int | None = None  # the output cap sent when [client] cap_client_tokens cut the caller's to it
    # seconds to the first output (0: off): a stream's first chunk with output; a plain
    # answer's whole body (its first token comes with it). See ARCHITECTURE.md, "Streams".
    first_token: float = 0.0
    stall: float = 0.0  # seconds a stream's read may wait once output began (0: off)
    deadline_cut: bool = False  # ``timeout`` is the request's deadline, shorter than attempt_timeout
    streamed: bool = False  # a streaming attempt (its URL may differ: ``Target.url``)

    @property
    def caller(self) -> Format | None:
        """The caller's format when the answer must cross back to it, else None."""
        r = self.request
        return r.format if r is not None and r.format is not self.api else None


def chat_request(
    t: Target,
    request: Request,
    token_param: TokenParam,
    config: Config,
    stream: bool,
    *,
    time_left: float | None = None,
) -> Sending:
    """The request one attempt sends to ``t``: the caller's fields in the target's format
    (capmon/core/providers/formats.py), this model's cap, and ``[client] attempt_timeout`` cut to the
    request's ``time_left`` (seconds)."""
    limit = token_limit(request.max_tokens, t, config.client.cap_client_tokens)
    lowered = limit if request.max_tokens is not None and limit < request.max_tokens else None
    out = formats.outbound(request, t, token_param=token_param, limit=limit, stream=stream, client=config.client)
    cc = config.client
    timeout = cc.attempt_timeout if time_left is None else min(cc.attempt_timeout, time_left)
    # The request's own first-token limit, else the config's for a stream; a plain answer's
    # first token comes with its whole body, which attempt_timeout bounds for long answers.
    own = request.first_token_timeout
    first = own if own is not None else (cc.first_token_timeout if stream else 0.0)
    return Sending(
        t,
        out.body,
        max(0.0, timeout),
        cc.max_response_bytes,
        config.backoff.max_hint,
        out.wire,
        out.dropped,
        request,
        lowered,
        first_token=max(0.0, first),
        stall=cc.stall_timeout if stream else 0.0,
        deadline_cut=timeout < cc.attempt_timeout,
        streamed=stream,
    )


def silent(limit: float) -> Failure:
    """No response headers within ``limit`` seconds: the route is silent (policy.py opens its
    breaker at once, and the request goes elsewhere)."""
    return Failure(Kind.CAPACITY, f"no response headers within {limit:g}s: the route is silent", code=SILENT)


def no_first_token(limit: float, status: int | None) -> Failure:
    """Headers came but no output within ``limit`` seconds: left like a full model."""
    return Failure(Kind.CAPACITY, f"no first token within {limit:g}s (first_token_timeout)", status, code=FIRST_TOKEN)


def stalled(limit: float, status: int | None) -> Failure:
    """No bytes for ``limit`` seconds after output began: a break, like a cut."""
    return Failure(
        Kind.TRANSIENT,
        f"stream stalled: no bytes for {limit:g}s after output began (stall_timeout)",
        status,
        code=STALLED,
    )


def _build(http: Sender, req: Sending) -> httpx.Request:
    t = req.target
    url = t.url(req.api, req.streamed)
    extra = t.dialect.caller_headers(t.http_headers, req.request) if req.request is not None else None
    head = t.head(req.api, req.streamed) if extra is None else Sender.head(url, extra)
    return http.request(url, head, json.dumps(req.body).encode())


async def _sent(http: Sender, req: Sending) -> httpx.Response:
    """Build the attempt's request, let the key's per-request hook sign it (its body is
    final; capmon/core/providers/dialect.py, ``Auth.sign``: none for a static key), send it."""
    request = _build(http, req)
    sign = req.target.auth.sign
    if sign is not None:
        await sign(request)
    return await http.send(request)


def _crossed(req: Sending, answer: Answer, response: Mapping[str, Any], wall: float) -> None:
    """The answer in the caller's format, or why it cannot be told in it."""
    if req.caller is None:
        answer.response = response
        return
    try:
        answer.response = formats.answer_in(req.caller, req.api, response, created=int(wall))
    except BrokenAnswer as e:
        answer.failure = e.failure
    except formats.Incapable as e:
        answer.failure = Failure(Kind.TRANSIENT, f"an answer the {req.caller.value} format cannot carry: {e}", 200)


def _whole_body(
    req: Sending, answer: Answer, resp: httpx.Response, body: bytes, wall: float
) -> Mapping[str, Any] | None:
    """A whole body read (a plain answer's): the answer in the target's wire (and
    ``answer.response`` in the caller's), or None and ``answer.failure`` says why."""
    parsed = formats.parse_plain(req.api, resp.status_code, body)
    if parsed is None and 200 <= resp.status_code < 300:
        # A 2xx that is no answer: the wire's format may say why (a failed response), else the classifier.
        answer.failure = formats.unfinished(
            req.api, resp.status_code, resp.headers, body, now=wall, quota_hint=req.quota_hint
        )
    if parsed is not None:
        _crossed(req, answer, parsed, wall)
    elif answer.failure is None:
        answer.failure = classify_response(resp.status_code, resp.headers, body, now=wall, quota_hint=req.quota_hint)
    return parsed if answer.failure is None else None


def _json(resp: httpx.Response) -> bool:
    """The body is one JSON document (``application/json``, ``application/problem+json``), not a stream."""
    kind: str = resp.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


async def plain(http: Sender, req: Sending, *, wall: float) -> Answer:
    """Send a non-streaming request; every failure is classified, never raised (but
    cancellation)."""
    answer = Answer(wire=req.api, dropped=req.dropped)
    first = 0.0 < req.first_token < req.timeout  # the first-token limit comes before the attempt's
    headers = False
    try:
        async with asyncio.timeout(req.first_token if first else req.timeout):
            resp = await _sent(http, req)
            headers = True
            try:
                answer.status = resp.status_code
                try:
                    body = await read_capped(resp, req.cap)
                except Oversized:
                    answer.failure = oversized_failure(req.cap, resp.status_code, streaming=False)
                    return answer
            finally:
                await resp.aclose()
        _whole_body(req, answer, resp, body, wall)
    except asyncio.CancelledError:
        raise
    except TimeoutError as e:
        answer.status = None  # no whole answer came back
        if first:  # a plain answer's first token is the whole answer
            answer.failure = no_first_token(req.first_token, None)
        elif not headers and not req.deadline_cut:
            answer.failure = silent(req.timeout)
        else:  # the request's deadline cut it: a transient timeout, no news to the breaker
            answer.failure = classify_exception(e)
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
    """A streaming attempt. Iterate :meth:`chunks` for the chunks (in the caller's format:
    a stream in another wire is translated as it comes, capmon/core/providers/formats.py);
    ``answer`` says how it ended once iteration stops. Closing the iterator early
    (``aclose()``) releases the connection."""

    http: Sender
    req: Sending
    clock_now: Any  # () -> float, the loop's clock
    wall: float
    answer: Answer = field(default_factory=Answer)

    async def chunks(self) -> AsyncIterator[Mapping[str, Any]]:
        answer = self.answer
        answer.wire, answer.dropped = self.req.api, self.req.dropped
        req = self.req
        # the send and every read of the body, one timer: the first output's limit until it
        # comes, a stall's per read after it (reads.py)
        first = req.first_token if 0.0 < req.first_token < req.timeout else None
        reads = ReadDeadline(self.clock_now, req.timeout, first=first, idle=req.stall or None)
        resp: httpx.Response | None = None
        held: list[Mapping[str, Any]] = []
        reader = formats.WireReader(self.req.api)
        r = self.req.request
        codec = formats.stream_codec(r, self.req.api, created=int(self.wall)) if r is not None else formats.SAME
        try:
            resp = await reads.read(_sent(self.http, self.req))
            answer.status = resp.status_code
            if resp.status_code >= 300:
                try:
                    body = await reads.read(read_capped(resp, min(self.req.cap, 1 << 20)))
                except Oversized:
                    body = b""
                answer.failure = classify_response(
                    resp.status_code, resp.headers, body, now=self.wall, quota_hint=self.req.quota_hint
                )
                return
            if _json(resp):
                # A plain answer to a stream request (a server that ignores ``stream``): read
                # whole, it is the whole answer, told to the caller as its stream's events.
                for told in await self._plain_body(resp, reads):
                    yield told
                return
            parser = self.req.target.dialect.framing()  # the endpoint's framing: SSE, Google's, AWS's event stream
            size = 0
            done = drain = False
            pieces = body_pieces(resp)
            while not done:
                # The deadline guards the reads only: a timeout scope around a yield would
                # cancel the caller's own work between chunks.
                try:
                    piece = await reads.read(pieces.__anext__())
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
                    event = reader.read(frame, now=self.wall, quota_hint=self.req.quota_hint)
                    kind = event.kind
                    if kind in (FrameKind.ERROR, FrameKind.BROKEN):
                        answer.failure = event.failure
                        return
                    last = kind is FrameKind.DONE
                    if event.chunk is not None and (last or kind is FrameKind.CHUNK):
                        # The Responses and Messages wires' last event goes to the caller too.
                        reader.add(event.chunk, last)
                        out = codec.feed(event.chunk)
                        if answer.output_sent or event.output or last:
                            if not answer.output_sent:
                                reads.output()
                                answer.output_sent = True
                            for c in held:
                                yield c
                            held.clear()
                            for c in out:
                                yield c
                        else:
                            held += out
                    if last:
                        reader.finished = done = drain = True
                        break
            if not reader.finished:
                answer.failure = Failure(Kind.TRANSIENT, "stream ended before [DONE]", resp.status_code)
                return
            # The wire's own end came: only now is the answer checked whole, and only a whole
            # one gets the caller's end (across formats the codec kept it back until here).
            end = [*held, *codec.close()]  # held: an answer with no output at all (rare, but complete)
            whole = reader.answer()
            if whole is not None:
                _crossed(self.req, answer, whole, self.wall)
            if answer.failure is not None:
                return
            for c in end:
                yield c
            if drain:
                await _drain(pieces, min(_DRAIN_SECONDS, reads.left()))
        except asyncio.CancelledError:
            raise
        except BrokenAnswer as e:  # a tool call that ended with arguments the caller cannot use
            answer.failure = e.failure
        except TimeoutError as e:
            answer.failure = self._timed_out(reads.why, resp, e)
        except Exception as e:  # timeouts, resets mid-stream: classified
            answer.failure = classify_exception(e)
        finally:
            reads.close()
            if resp is not None:
                await resp.aclose()

    async def _plain_body(self, resp: httpx.Response, reads: ReadDeadline) -> list[dict[str, Any]]:
        """A plain body to a stream request: its answer as the stream's events in the caller's
        format (formats.answer_as_stream), all of them output; or none, and ``answer.failure``
        says why (a 2xx that is no answer is classified as a plain one is)."""
        req, answer = self.req, self.answer
        try:
            body = await reads.read(read_capped(resp, req.cap))
        except Oversized:
            answer.failure = oversized_failure(req.cap, resp.status_code, streaming=False)
            return []
        if _whole_body(req, answer, resp, body, self.wall) is None or answer.response is None:
            return []
        r = req.request
        caller = req.api if r is None else r.format
        try:
            asked = r is not None and formats.asks_usage(r)
            events = formats.answer_as_stream(caller, answer.response, created=int(self.wall), include_usage=asked)
        except formats.Incapable as e:
            answer.failure = Failure(Kind.TRANSIENT, f"an answer the {caller.value} format cannot carry: {e}", 200)
            return []
        reads.output()
        answer.output_sent = True
        return events

    def _timed_out(self, why: Cut, resp: httpx.Response | None, e: TimeoutError) -> Failure:
        """What a read cut by one of the bounds (reads.py) comes to."""
        req, status = self.req, resp.status_code if resp is not None else None
        if why is Cut.IDLE:
            return stalled(req.stall, status)
        if why is Cut.FIRST:
            return silent(req.first_token) if resp is None else no_first_token(req.first_token, status)
        if resp is None and not req.deadline_cut:  # the attempt's own timeout, and not one header
            return silent(req.timeout)
        return classify_exception(e)  # the request's deadline: a transient timeout
