"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``),
plain and streamed, on the same slots, schedules, penalties, faults and capacity dialects
as the OpenAI APIs. Only models whose scenario ``api`` is ``anthropic`` (or ``all``) are
served here; any other name is Anthropic's 404.

Versions, chosen by the ``anthropic-version`` header (a missing or unknown one is Anthropic's
400 naming the header):
  2026-10-21  the current one (Python SDK 2.x, TypeScript 1.x): ``temperature``, ``top_p``
              and ``top_k`` are refused ("Extra inputs are not permitted") even at their
              defaults, as are document blocks in assistant messages and citations on
              user text blocks.
  2023-06-01  older SDKs: takes the sampling parameters (checked against their ranges).

The key is ``x-api-key`` or ``Authorization: Bearer`` (``x-api-key`` wins when both are
sent). Shapes follow anthropic-sdk-python's ``types`` (Message, Usage and the
MessageStreamEvent family); a stream is ``message_start``, ``content_block_start``,
``ping``, ``content_block_delta`` (``text_delta``, or ``input_json_delta`` pieces of a tool
call's input), ``content_block_stop``, ``message_delta`` (stop reason, usage),
``message_stop``. A model whose dialect is ``anthropic-stream`` rejects inside the 200
stream: ``message_start``, then ``event: error`` with overloaded_error; the
``stream_error`` fault sends that error after ``after`` deltas (0: before any output).
"""

from __future__ import annotations

import enum
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from capmon.core.base.clock import Clock
from capmon.core.providers.tokens import estimate_body
from capmon.core.types.result import Format
from capmon.sim import dialects, structured
from capmon.sim.dialects import Api, Wire
from capmon.sim.faults import DropConnection, FaultMode
from capmon.sim.model import Admitted, Faulted, Simulator, Ticket
from capmon.sim.replies import BadRequest, SlotStream, faulted, hold, read_request, rejection, simulator, wire
from capmon.sim.resume import PREFILL_REFUSAL, resumed, with_resume
from capmon.sim.streams import answer_pieces, answer_text, argument_pieces, tokens_of
from capmon.sim.structured import Output, OutputError, with_output
from capmon.sim.tools import (
    LastTurn,
    ToolCall,
    ToolError,
    ToolRequest,
    Voice,
    broken_call,
    closing_turn,
    make_call,
    may_call,
    parse_anthropic_tools,
)
from capmon.sim.usage import HONEST, reported

VERSION_HEADER = "anthropic-version"
SAMPLING_PARAMS = ("temperature", "top_p", "top_k")
# "system": a mid-conversation system message (the SDK's SystemMessageParam, Claude Code's
# mid-conversation-system beta), as the API takes it.
ROLES = ("user", "assistant", "system")
UNPARSABLE = "There was an error parsing the body of your request. Please ensure it is valid JSON."


class ApiVersion(str, enum.Enum):
    V2023_06_01 = "2023-06-01"
    V2026_10_21 = "2026-10-21"  # the current one


# Vertex AI's rawPredict takes the version in the body: the one its docs name, which keeps
# the 2023-06-01 rules, and the ones the SDKs send (AnthropicVertex 2.x sends its own).
VERTEX_VERSION_FIELD = "anthropic_version"
VERTEX_VERSIONS = {
    "vertex-2023-10-16": ApiVersion.V2023_06_01,
    "bedrock-2023-05-31": ApiVersion.V2023_06_01,  # Bedrock's InvokeModel
    **{v.value: v for v in ApiVersion},
}


@dataclass(frozen=True)
class MessagesVia:
    """How a Messages request reached the handler: Anthropic's own URL, Vertex AI's
    rawPredict (``wire`` VERTEX), where the URL names the model (``model``), the body carries
    ``anthropic_version``, and Google's front end has checked the token and the model; or
    Bedrock's InvokeModel (``wire`` BEDROCK, the same body), whose front end answers every
    error in Bedrock's shape (capmon/sim/bedrock.py frames its streams)."""

    wire: Wire = Wire.ANTHROPIC  # the wire whose models the request may name
    model: str | None = None
    stream: bool | None = None  # set when the URL says whether it streams (Bedrock's)

    @property
    def front(self) -> Wire:
        """The wire whose key the request carries and whose shape its errors take."""
        return Wire.BEDROCK if self.wire is Wire.BEDROCK else Wire.ANTHROPIC


ANTHROPIC_VIA = MessagesVia()


# finish_reason of a Ticket -> Anthropic's stop_reason
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


@dataclass(frozen=True)
class MessagesRequest:
    model: str
    prompt_tokens: int
    max_tokens: int  # 0 for count_tokens, which takes none
    stream: bool
    version: ApiVersion
    tools: ToolRequest | None = None
    turn: LastTurn | None = None
    resume: str | None = None  # the partial answer it asks the model to go on with (capmon/sim/resume.py)
    prefilled: bool = False  # ... as the model's own last message (a prefill)
    output: Output | None = None  # the JSON it asks for (capmon/sim/structured.py)


def _voice(message: dict[str, Any]) -> tuple[Voice, Any]:
    """A message's voice and what it says: a user message with ``tool_result`` blocks speaks
    for the tools (their results), whatever text comes with them."""
    role, content = message.get("role"), message.get("content")
    if role == "system":  # a mid-conversation system message
        return Voice.ASIDE, content
    if role != "user":
        return Voice.MODEL, content
    results = [b for b in _blocks(content) if isinstance(b, dict) and b.get("type") == "tool_result"]
    return (Voice.RESULT, results) if results else (Voice.USER, content)


def last_turn(messages: list[dict[str, Any]]) -> LastTurn | None:
    """The user's words or the tools' results the conversation ends with (tools.closing_turn)."""
    return closing_turn(_voice(m) for m in reversed(messages))


def vertex_version(body: Any) -> ApiVersion:
    """The version in a Vertex AI body. Raises BadRequest."""
    value = body.get(VERTEX_VERSION_FIELD) if isinstance(body, dict) else None
    if value is None:
        raise BadRequest(f"{VERTEX_VERSION_FIELD}: Field required", VERTEX_VERSION_FIELD)
    if not isinstance(value, str) or value not in VERTEX_VERSIONS:
        raise BadRequest(f'{VERTEX_VERSION_FIELD}: "{value}" is not a valid version', VERTEX_VERSION_FIELD)
    return VERTEX_VERSIONS[value]


def api_version(header: str | None) -> ApiVersion:
    """The request's version. Raises BadRequest worded as Anthropic words it."""
    if not header:
        raise BadRequest(f"{VERSION_HEADER}: header is required")
    try:
        return ApiVersion(header.strip())
    except ValueError:
        raise BadRequest(f'{VERSION_HEADER}: "{header}" is not a valid version') from None


def _blocks(content: Any) -> list[Any]:
    return content if isinstance(content, list) else []


def _check_version_rules(body: dict[str, Any], messages: list[dict[str, Any]], version: ApiVersion) -> None:
    if version is ApiVersion.V2026_10_21:
        for name in SAMPLING_PARAMS:
            if name in body:
                raise BadRequest(f"{name}: Extra inputs are not permitted", name)
        for i, m in enumerate(messages):
            for j, block in enumerate(_blocks(m.get("content"))):
                if not isinstance(block, dict):
                    continue
                if m["role"] == "assistant" and block.get("type") == "document":
                    raise BadRequest(
                        f"messages.{i}.content.{j}: document blocks are not permitted in assistant messages"
                    )
                if m["role"] == "user" and block.get("type") == "text" and block.get("citations"):
                    raise BadRequest(f"messages.{i}.content.{j}.text.citations: Extra inputs are not permitted")
        return
    for name, high in (("temperature", 1.0), ("top_p", 1.0), ("top_k", None)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise BadRequest(f"{name}: Input should be a number greater than or equal to 0", name)
        if high is not None and value > high:
            raise BadRequest(f"{name}: Input should be less than or equal to {high:g}", name)


def parse_messages(body: Any, version: ApiVersion, *, counting: bool = False) -> MessagesRequest:
    """A Messages request (``counting``: a count_tokens request, no max_tokens). Raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("Input should be a valid dictionary")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: Field required", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages: Field required", "messages", model)
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise BadRequest(f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'", "messages", model)
        if not isinstance(m.get("content"), (str, list)):
            raise BadRequest(f"messages.{i}.content: Field required", "messages", model)
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise BadRequest("system: Input should be a valid string", "system", model)
    max_tokens = body.get("max_tokens")
    if not counting:
        if max_tokens is None:
            raise BadRequest("max_tokens: Field required", "max_tokens", model)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise BadRequest("max_tokens: Input should be a valid integer", "max_tokens", model)
        if max_tokens < 1:
            raise BadRequest("max_tokens: Input should be greater than or equal to 1", "max_tokens", model)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: Input should be a valid boolean", "stream", model)
    try:
        _check_version_rules(body, messages, version)
        tools = parse_anthropic_tools(body)
        output = structured.parse_messages(body)
    except BadRequest as e:
        raise BadRequest(str(e), e.param, model) from None
    except (ToolError, OutputError) as e:
        raise BadRequest(str(e), e.param, model) from None
    return MessagesRequest(
        model,
        estimate_body(Format.MESSAGES, body),  # the project's one estimate, as the gateway counts
        max_tokens if isinstance(max_tokens, int) and not counting else 0,
        stream and not counting,
        version,
        tools,
        last_turn(messages),
        *resumed(messages),
        output,
    )


# ---------------------------------------------------------------- shapes


def message_id() -> str:
    return f"msg_sim{secrets.token_hex(12)}"


def _usage(input_tokens: int, output_tokens: int, report: str) -> dict[str, Any]:
    counts = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }
    return reported(counts, report)


def message_object(
    mid: str,
    model: str,
    input_tokens: int,
    *,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    output_tokens: int,
    report: str = HONEST,
) -> dict[str, Any]:
    """A Messages answer; ``report``: how its model reports the tokens used (capmon/sim/usage.py)."""
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": _usage(input_tokens, output_tokens, report),
    }


def _tool_block(call: ToolCall, *, whole: bool) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments) if whole else {}}


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # a broken_tool_args fault's: the cut text where Anthropic's object belongs


def complete_message(mid: str, ticket: Ticket, call: ToolCall | None, tool_result: str | None = None) -> dict[str, Any]:
    if call is None:
        content = [{"type": "text", "text": " ".join(answer_text(ticket, tool_result))}]
        reason, output = STOP_REASONS[ticket.finish_reason], ticket.completion_tokens
    else:
        content, reason, output = [_tool_block(call, whole=True)], "tool_use", tokens_of(call.arguments)
    return message_object(
        mid,
        ticket.model,
        ticket.prompt_tokens,
        content=content,
        stop_reason=reason,
        output_tokens=output,
        report=ticket.usage,
    )


def event(name: str, **fields: Any) -> bytes:
    return f"event: {name}\ndata: ".encode() + json.dumps({"type": name, **fields}).encode() + b"\n\n"


def _started(mid: str, model: str, input_tokens: int, report: str = HONEST) -> bytes:
    # Anthropic counts the first output token in message_start's usage already.
    started = message_object(mid, model, input_tokens, content=[], stop_reason=None, output_tokens=1, report=report)
    return event("message_start", message=started)


async def message_stream(
    clock: Clock,
    mid: str,
    ticket: Ticket,
    call: ToolCall | None,
    *,
    tool_result: str | None = None,
    cut: bool = False,
    error_after: int | None = None,
    cut_after: int = 0,
) -> AsyncIterator[bytes]:
    """The whole stream of one admitted (or faulted) request."""
    yield _started(mid, ticket.model, ticket.prompt_tokens, ticket.usage)
    await clock.sleep(ticket.first_token)
    if error_after == 0:
        yield dialects.anthropic_error_event()  # after message_start, before any output
        return
    if call is None:
        pieces, costs = answer_pieces(ticket, tool_result)
        block: dict[str, Any] = {"type": "text", "text": ""}
        reason, output = STOP_REASONS[ticket.finish_reason], ticket.completion_tokens

        def delta(piece: str) -> dict[str, Any]:
            return {"type": "text_delta", "text": piece}
    else:
        pieces = argument_pieces(call.arguments)
        costs = [tokens_of(p) for p in pieces]
        block, reason, output = _tool_block(call, whole=False), "tool_use", tokens_of(call.arguments)

        def delta(piece: str) -> dict[str, Any]:
            return {"type": "input_json_delta", "partial_json": piece}

    yield event("content_block_start", index=0, content_block=block)
    yield event("ping")
    for i, piece in enumerate(pieces):
        if cut and i >= (cut_after or len(pieces) // 2):
            return  # the stream just stops: no content_block_stop, no message_stop
        await clock.sleep(ticket.per_token * costs[i])
        yield event("content_block_delta", index=0, delta=delta(piece))
        if error_after is not None and i + 1 >= error_after:
            break
    if error_after is not None:
        yield dialects.anthropic_error_event()  # after output: the stream fails, never a truncated success
        return
    yield event("content_block_stop", index=0)
    used = reported({"output_tokens": output}, ticket.usage)
    yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": None}, usage=used)
    yield event("message_stop")


async def rejection_stream(mid: str, model: str, input_tokens: int) -> AsyncIterator[bytes]:
    """A full model that says so inside a 200 stream: the message starts, then fails."""
    yield _started(mid, model, input_tokens)
    yield dialects.anthropic_error_event()


# ---------------------------------------------------------------- endpoints


def _request_headers() -> dict[str, str]:
    return {"request-id": f"req_sim{secrets.token_hex(12)}"}


async def _read(
    request: Request, headers: dict[str, str], via: MessagesVia, *, counting: bool
) -> tuple[Simulator, str, MessagesRequest] | Response:
    """Size, key, JSON and version: the steps both endpoints take before a model."""
    sim = simulator(request)
    limit = sim.scenario.max_request_bytes
    declared = request.headers.get("content-length", "")
    if (declared.isdigit() and int(declared) > limit) or len(await request.body()) > limit:
        err = dialects.status_error(413, via.front)
        return wire(err, headers)
    header = request.headers.get(VERSION_HEADER)

    def parse(body: Any) -> MessagesRequest:
        if via.wire is Wire.ANTHROPIC:
            return parse_messages(body, api_version(header), counting=counting)
        version = vertex_version(body)
        named = {"model": via.model} if via.model else {}
        streams = {} if via.stream is None else {"stream": via.stream}
        return parse_messages(
            {**body, **named, **streams} if isinstance(body, dict) else body, version, counting=counting
        )

    return await read_request(request, parse, UNPARSABLE, via.front, headers)


def _tool_call(req: MessagesRequest, mode: str) -> ToolCall | None:
    tool = req.tools.wants_call(mode, req.turn) if req.tools is not None else None
    return None if tool is None else make_call(tool, prefix="toolu_sim")


async def create_message(request: Request) -> Response | DropConnection:
    return await serve_message(request, ANTHROPIC_VIA)


async def serve_message(request: Request, via: MessagesVia) -> Response | DropConnection:
    """A Messages request, reached through Anthropic's URL or Vertex AI's (``via``)."""
    headers = _request_headers()
    read = await _read(request, headers, via, counting=False)
    if isinstance(read, Response):
        return read
    sim, alias, req = read
    if req.prefilled and sim.has_model(req.model, via.wire) and not sim.state(req.model).prefill:
        sim.bad_request(alias, req.model)
        return wire(dialects.bad_request(PREFILL_REFUSAL, "messages", via.front), headers)
    decision = sim.submit(
        alias,
        req.model,
        prompt_tokens=req.prompt_tokens,
        max_tokens=req.max_tokens,
        stream=req.stream,
        api=Api.MESSAGES,
        wire=via.wire,
        tools=may_call(req.tools, req.turn),
    )
    decision = with_output(with_resume(decision, req.resume), req.output, sim, req.turn)
    mid = message_id()

    def in_stream(_dialect: str, model: str) -> AsyncIterator[bytes]:
        return rejection_stream(mid, model, req.prompt_tokens)

    refused = rejection(
        decision,
        api=Api.MESSAGES,
        stream=req.stream,
        in_stream=in_stream,
        on=via.front,
        now=sim.clock.wall(),
        headers=headers,
    )
    if refused is not None:
        return refused
    if isinstance(decision, Faulted):
        return await _faulted(sim, decision, req, mid, headers, via.front)
    assert isinstance(decision, Admitted)
    ticket = decision.ticket
    call = _tool_call(req, sim.state(req.model).tools)
    result = req.turn.tool_result if req.turn is not None else None
    if req.stream:
        return SlotStream(
            message_stream(sim.clock, mid, ticket, call, tool_result=result),
            lambda done: sim.release(ticket, completed=done),
            headers,
        )
    await hold(sim, ticket)
    return JSONResponse(complete_message(mid, ticket, call, result), headers=headers)


async def _faulted(
    sim: Simulator, decision: Faulted, req: MessagesRequest, mid: str, headers: dict[str, str], front: Wire
) -> Response | DropConnection:
    rule, ticket = decision.rule, decision.ticket
    broken = broken_call(req.tools, req.turn, "toolu_sim") if rule.mode is FaultMode.BROKEN_TOOL_ARGS else None

    def streamed(clock: Clock, call: ToolCall | None) -> AsyncIterator[bytes]:
        return message_stream(
            clock,
            mid,
            ticket,
            call,
            cut=rule.mode is FaultMode.STREAM_CUT,
            cut_after=rule.after if rule.mode is FaultMode.STREAM_CUT else 0,
            error_after=rule.after if rule.mode is FaultMode.STREAM_ERROR else None,
        )

    def answer(call: ToolCall | None) -> bytes:
        return json.dumps(complete_message(mid, ticket, call)).encode()

    return await faulted(
        sim,
        decision,
        stream=req.stream,
        call=_tool_call(req, decision.state.tools),
        broken=broken,
        streamed=streamed,
        answer=answer,
        on=front,
        headers=headers,
    )


async def count_tokens(request: Request, via: MessagesVia = ANTHROPIC_VIA) -> Response:
    """``{"input_tokens": N}``, the same N a message's usage reports; takes no slot."""
    headers = _request_headers()
    read = await _read(request, headers, via, counting=True)
    if isinstance(read, Response):
        return read
    sim, alias, req = read
    if not sim.has_model(req.model, via.wire):
        sim.bad_request(alias, req.model)
        return wire(dialects.model_not_found(req.model, Wire.ANTHROPIC), headers)
    return JSONResponse({"input_tokens": req.prompt_tokens}, headers=headers)
