"""AWS Bedrock's Converse API, ``POST /model/{modelId}/converse`` and
``/model/{modelId}/converse-stream`` (bedrock-runtime 2023-09-30), on the same slots,
schedules, penalties, faults and capacity dialects as the other APIs. Only models whose
scenario ``api`` serves the bedrock wire (bedrock, anthropic+bedrock, anthropic+vertex+bedrock,
all) are served. The id comes URL-encoded (boto3 sends ``:`` as ``%3A``); an inference
profile's id (``us.anthropic.sim-claude-v1:0``) is a model name like any other, and an ARN
names the model or profile after its last ``/``. The base id of a model served only as a
profile (the id without its ``us.``, ``eu.``... prefix) is Bedrock's 400 ValidationException
for an on-demand id that needs an inference profile; any other unknown id its 404
ResourceNotFoundException.

The caller signs with SigV4 (service ``bedrock``; the access key id is one of the scenario's
keys and its secret the same string: capmon/core/providers/aws_sigv4.py), or sends a Bedrock API key as
``Authorization: Bearer``. No credentials is a 403 AccessDeniedException, an unknown key a 403
UnrecognizedClientException, a wrong signature a 403 InvalidSignatureException.

Answers follow boto3's shapes: ``output.message{role: "assistant", content[{text} |
{toolUse{toolUseId, name, input}}]}``, ``stopReason`` (end_turn, tool_use, max_tokens when
``inferenceConfig.maxTokens`` cut the answer, stop_sequence before the first of
``stopSequences`` the answer would say, malformed_tool_use for a broken_tool_args fault's call,
which cannot be sent as an object), ``usage{inputTokens, outputTokens, totalTokens}``,
``metrics.latencyMs``. A stream is AWS's binary event stream (capmon/core/providers/aws_frames.py):
messageStart, contentBlockStart (a tool call's), contentBlockDelta (text pieces, or the call's
input as pieces of its JSON), contentBlockStop, messageStop{stopReason}, metadata{usage,
metrics}. Errors are Bedrock's (dialects.bedrock_error: ``x-amzn-ErrorType`` and
``{"message"}``); a model whose dialect is ``bedrock-stream`` (throttlingException),
``bedrock-stream-503`` (serviceUnavailableException), ``bedrock-stream-error``
(modelStreamErrorException) or ``bedrock-stream-frame`` (an error message of the stream:
``:message-type: error``, ``:error-code: ThrottlingException``) says "no" inside the 200
stream, and the ``stream_error`` fault sends that exception after ``after`` deltas (0: before
any event).

InvokeModel, with Anthropic's body, is capmon/sim/bedrock_invoke.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from capmon.core.base.clock import Clock
from capmon.core.providers import aws_sigv4 as sigv4
from capmon.core.providers.aws_frames import MEDIA_TYPE, event
from capmon.core.providers.tokens import estimate_body
from capmon.core.types.result import Format
from capmon.sim import dialects, structured
from capmon.sim.dialects import Api, Wire
from capmon.sim.faults import DropConnection, FaultMode
from capmon.sim.model import Admitted, Faulted, Simulator, Ticket
from capmon.sim.replies import (
    BadRequest,
    SlotStream,
    faulted,
    hold,
    read_request,
    rejection,
    simulator,
    wire,
)
from capmon.sim.resume import resumed, with_resume
from capmon.sim.streams import answer_pieces, argument_pieces, tokens_of, until_stop
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
    parse_converse_tools,
    text_of,
)
from capmon.sim.usage import reported

UNPARSABLE = "Malformed input request, please reformat your input and try again."
ROLES = ("user", "assistant")
# A content block carries exactly one of these (bedrock-runtime's ContentBlock union).
BLOCKS = (
    "text",
    "image",
    "document",
    "video",
    "toolUse",
    "toolResult",
    "guardContent",
    "cachePoint",
    "reasoningContent",
    "citationsContent",
)
# The prefixes of cross-region inference profiles' ids.
PROFILE_GEOS = ("us", "eu", "apac", "au", "ca", "jp", "us-gov", "global")
# finish_reason of a Ticket -> Converse's stopReason
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
TOOL_USE, STOP_SEQUENCE, MALFORMED = "tool_use", "stop_sequence", "malformed_tool_use"
TOOL_USE_PREFIX = "tooluse_"


@dataclass(frozen=True)
class ConverseRequest:
    model: str
    prompt_tokens: int
    max_tokens: int | None
    stops: tuple[str, ...] = ()
    tools: ToolRequest | None = None
    turn: LastTurn | None = None
    resume: str | None = None  # the partial answer it asks the model to go on with (capmon/sim/resume.py)
    output: Output | None = None  # the JSON it asks for (capmon/sim/structured.py)


def _invalid(where: str, constraint: str, model: str, value: Any = None) -> BadRequest:
    """Bedrock's wording for a field that fails its model's constraints."""
    shown = "null" if value is None else f"'{value}'"
    return BadRequest(
        f"1 validation error detected: Value {shown} at '{where}' failed to satisfy constraint: {constraint}",
        where,
        model,
    )


def _voice(message: dict[str, Any]) -> tuple[Voice, Any]:
    """A message's voice and what it says: a user message with toolResult blocks speaks for
    the tools (their results)."""
    content = message["content"]
    if message["role"] == "assistant":
        return Voice.MODEL, content
    results = [text_of(b["toolResult"].get("content")) for b in content if isinstance(b.get("toolResult"), dict)]
    return (Voice.RESULT, results) if results else (Voice.USER, content)


def last_turn(messages: list[dict[str, Any]]) -> LastTurn | None:
    """The user's words or the tools' results the conversation ends with (tools.closing_turn)."""
    return closing_turn(_voice(m) for m in reversed(messages))


def _counted(block: dict[str, Any]) -> dict[str, Any]:
    """A block as the project's one estimate reads a chat content part (tokens.py)."""
    if isinstance(block.get("text"), str):
        return {"text": block["text"]}
    if isinstance(block.get("toolUse"), dict):
        return {"input": block["toolUse"].get("input") or {}}
    if isinstance(block.get("toolResult"), dict):
        return {"text": text_of(block["toolResult"].get("content"))}
    return {}


def prompt_tokens(messages: list[dict[str, Any]], system: list[Any], tools: Any) -> int:
    """The prompt as the project's one estimate counts it: each message, the system blocks
    as one more, the tool specs as their JSON."""
    counted = [{"content": [_counted(b) for b in m["content"]]} for m in messages]
    if system:
        counted.insert(0, {"content": [_counted(b) for b in system if isinstance(b, dict)]})
    return estimate_body(Format.CHAT, {"messages": counted, "tools": tools})


def _messages(body: dict[str, Any], model: str) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "Member must not be null", model)
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _invalid(
                f"messages.{i + 1}.member.role", "Member must satisfy enum value set: [user, assistant]", model
            )
        content = m.get("content")
        if not isinstance(content, list) or not content:
            raise _invalid(f"messages.{i + 1}.member.content", "Member must not be null", model)
        for block in content:
            if not isinstance(block, dict) or sum(k in block for k in BLOCKS) != 1:
                raise BadRequest("A content block must set exactly one of its members.", "messages", model)
    if messages[0]["role"] != "user":
        raise BadRequest(
            "A conversation must start with a user message. Try again with a conversation that starts with a "
            "user message.",
            "messages",
            model,
        )
    return messages


def _inference(body: dict[str, Any], model: str) -> tuple[int | None, tuple[str, ...]]:
    """``inferenceConfig``'s maxTokens and stopSequences (temperature and topP are taken, and
    change nothing)."""
    config = body.get("inferenceConfig", {})
    if not isinstance(config, dict):
        raise _invalid("inferenceConfig", "Member must be an object", model)
    limit = config.get("maxTokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _invalid("inferenceConfig.maxTokens", "Member must have value greater than or equal to 1", model, limit)
    stops = config.get("stopSequences", [])
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _invalid("inferenceConfig.stopSequences", "Member must be a list of non-empty strings", model)
    return limit, tuple(stops)


def parse_converse(body: Any, model: str) -> ConverseRequest:
    """A Converse request for ``model`` (the URL's). Raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest(UNPARSABLE, None, model)
    messages = _messages(body, model)
    system = body.get("system", [])
    if not isinstance(system, list):
        raise _invalid("system", "Member must be a list of system content blocks", model)
    limit, stops = _inference(body, model)
    try:
        tools = parse_converse_tools(body)
        output = structured.parse_converse(body)
    except (ToolError, OutputError) as e:
        raise BadRequest(str(e), e.param, model) from None
    uses_tools = any("toolUse" in b or "toolResult" in b for m in messages for b in m["content"])
    if uses_tools and tools is None:
        raise BadRequest(
            "The toolConfig field must be defined when using toolUse and toolResult content blocks.",
            "toolConfig",
            model,
        )
    specs = body["toolConfig"].get("tools") if tools is not None else None
    return ConverseRequest(
        model,
        prompt_tokens(messages, system, specs),
        limit,
        stops,
        tools,
        last_turn(messages),
        resumed(messages)[0],
        output,
    )


# ---------------------------------------------------------------- answers


def usage(prompt: int, output: int, report: str) -> dict[str, Any]:
    return reported({"inputTokens": prompt, "outputTokens": output, "totalTokens": prompt + output}, report)


def _latency_ms(ticket: Ticket) -> int:
    return round(ticket.service_time * 1000)


def _text(ticket: Ticket, tool_result: str | None, stops: tuple[str, ...]) -> tuple[list[str], list[int], str]:
    """The answer's pieces, each one's tokens, and its stopReason."""
    pieces, costs, stopped = until_stop(*answer_pieces(ticket, tool_result), stops)
    return pieces, costs, STOP_SEQUENCE if stopped else STOP_REASONS[ticket.finish_reason]


def converse_response(
    ticket: Ticket, call: ToolCall | None, tool_result: str | None = None, stops: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A whole Converse answer; usage as the ticket's model reports it (capmon/sim/usage.py)."""
    content: list[dict[str, Any]]
    if call is None:
        pieces, costs, reason = _text(ticket, tool_result, stops)
        content, output = [{"text": "".join(pieces)}], sum(costs)
    else:
        output = tokens_of(call.arguments)
        try:
            use = {"toolUseId": call.id, "name": call.name, "input": json.loads(call.arguments)}
            content, reason = [{"toolUse": use}], TOOL_USE
        except ValueError:  # a broken_tool_args fault's call: no object to send
            content, reason = [], MALFORMED
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": reason,
        "usage": usage(ticket.prompt_tokens, output, ticket.usage),
        "metrics": {"latencyMs": _latency_ms(ticket)},
    }


@dataclass(frozen=True)
class StreamPlan:
    """What one ConverseStream carries and how it ends."""

    ticket: Ticket
    call: ToolCall | None = None
    tool_result: str | None = None
    stops: tuple[str, ...] = ()
    cut: bool = False  # stop halfway (or after ``cut_after`` deltas): no messageStop
    cut_after: int = 0
    error_after: int | None = None  # this many deltas, then ``error_dialect``'s exception
    error_dialect: str = dialects.BEDROCK_STREAM


def _deltas(plan: StreamPlan) -> tuple[list[dict[str, Any]], list[int], str]:
    """The stream's deltas, each one's tokens, and its stopReason."""
    if plan.call is None:
        pieces, costs, reason = _text(plan.ticket, plan.tool_result, plan.stops)
        return [{"text": p} for p in pieces], costs, reason
    pieces = argument_pieces(plan.call.arguments)
    return [{"toolUse": {"input": p}} for p in pieces], [tokens_of(p) for p in pieces], TOOL_USE


async def stream_events(clock: Clock, plan: StreamPlan) -> AsyncIterator[bytes]:
    """The whole event stream of one admitted (or faulted) request."""
    ticket = plan.ticket
    await clock.sleep(ticket.first_token)
    if plan.error_after == 0:
        yield dialects.bedrock_stream_error(plan.error_dialect)
        return
    yield event("messageStart", {"role": "assistant"})
    if plan.call is not None:
        start = {"toolUse": {"toolUseId": plan.call.id, "name": plan.call.name}}
        yield event("contentBlockStart", {"contentBlockIndex": 0, "start": start})
    deltas, costs, reason = _deltas(plan)
    for i, delta in enumerate(deltas):
        if plan.cut and i >= (plan.cut_after or len(deltas) // 2):
            return  # the stream just stops: no messageStop, no metadata
        await clock.sleep(ticket.per_token * costs[i])
        yield event("contentBlockDelta", {"contentBlockIndex": 0, "delta": delta})
        if plan.error_after is not None and i + 1 >= plan.error_after:
            break
    if plan.error_after is not None:
        yield dialects.bedrock_stream_error(plan.error_dialect)  # after output: never a truncated success
        return
    yield event("contentBlockStop", {"contentBlockIndex": 0})
    yield event("messageStop", {"stopReason": reason})
    metadata = {
        "usage": usage(ticket.prompt_tokens, sum(costs), ticket.usage),
        "metrics": {"latencyMs": _latency_ms(ticket)},
    }
    yield event("metadata", metadata)


async def rejection_events(dialect: str) -> AsyncIterator[bytes]:
    """A full model that says so inside a 200 stream, before any event."""
    yield dialects.bedrock_stream_error(dialect)


# ---------------------------------------------------------------- endpoints


def model_id(raw: str) -> str:
    """The model a URL's id names: the id itself (decoded), or an ARN's last part
    (``arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic...``)."""
    raw = unquote(raw)
    return raw.rpartition("/")[2] if raw.startswith("arn:") else raw


def needs_profile(sim: Simulator, model: str) -> bool:
    """Whether ``model`` is the base id of a model served here only as an inference profile."""
    return not sim.has_model(model, Wire.BEDROCK) and any(
        sim.has_model(f"{geo}.{model}", Wire.BEDROCK) for geo in PROFILE_GEOS
    )


async def signature_refused(request: Request) -> Response | None:
    """A SigV4 request from a known key whose signature is wrong: Bedrock's 403 (counted as
    an auth rejection). None for anything else (a Bearer key, none, an unknown key id: the
    key check answers those)."""
    signed = sigv4.parse(request.headers.get("authorization", ""))
    sim = simulator(request)
    if signed is None or not sim.is_accepted(signed.access_key):
        return None
    query = request.scope.get("query_string", b"").decode("latin-1")
    path = request.scope.get("raw_path") or request.url.path.encode()
    url = f"http://{request.headers.get('host', 'localhost')}{path.decode('latin-1')}" + (f"?{query}" if query else "")
    if sigv4.verify(signed, signed.access_key, request.method, url, request.headers, await request.body()):
        return None
    sim.authenticate(None)  # counts the auth rejection
    return wire(dialects.bedrock_error(403, "InvalidSignatureException", dialects.BEDROCK_BAD_SIGNATURE))


def unknown_model(sim: Simulator, model: str, headers: dict[str, str]) -> Response:
    """A model not served on Bedrock: the on-demand ValidationException for the base id of a
    model served as an inference profile, else the 404."""
    if needs_profile(sim, model):
        message = dialects.BEDROCK_NEEDS_PROFILE.format(model=model)
        return wire(dialects.bedrock_error(400, dialects.VALIDATION, message), headers)
    return wire(dialects.model_not_found(model, Wire.BEDROCK), headers)


def _tool_call(req: ConverseRequest, mode: str) -> ToolCall | None:
    tool = req.tools.wants_call(mode, req.turn) if req.tools is not None else None
    return None if tool is None else make_call(tool, TOOL_USE_PREFIX)


async def converse(request: Request) -> Response | DropConnection:
    return await serve(request, stream=False)


async def converse_stream(request: Request) -> Response | DropConnection:
    return await serve(request, stream=True)


async def serve(request: Request, *, stream: bool) -> Response | DropConnection:
    """Converse (``stream``: ConverseStream) on the model the URL names."""
    headers = {"x-amzn-RequestId": str(uuid.uuid4())}
    model = model_id(request.path_params["model_id"])
    refused = await signature_refused(request)
    if refused is not None:
        return refused
    read = await read_request(request, lambda body: parse_converse(body, model), UNPARSABLE, Wire.BEDROCK, headers)
    if isinstance(read, Response):
        return read
    sim, alias, req = read
    if needs_profile(sim, model):
        sim.bad_request(alias, model)
        return unknown_model(sim, model, headers)
    decision = sim.submit(
        alias,
        model,
        prompt_tokens=req.prompt_tokens,
        max_tokens=req.max_tokens,
        stream=stream,
        api=Api.CONVERSE,
        wire=Wire.BEDROCK,
        tools=may_call(req.tools, req.turn),
    )
    decision = with_output(with_resume(decision, req.resume), req.output, sim, req.turn)
    refused = rejection(
        decision,
        api=Api.CONVERSE,
        stream=stream,
        in_stream=lambda dialect, _model: rejection_events(dialect),
        on=Wire.BEDROCK,
        now=sim.clock.wall(),
        headers=headers,
        stream_type=MEDIA_TYPE,
    )
    if refused is not None:
        return refused
    if isinstance(decision, Faulted):
        return await _faulted(sim, decision, req, headers, stream=stream)
    assert isinstance(decision, Admitted)
    ticket = decision.ticket
    call = _tool_call(req, sim.state(model).tools)
    result = req.turn.tool_result if req.turn is not None else None
    if stream:
        plan = StreamPlan(ticket, call, result, req.stops)
        return SlotStream(
            stream_events(sim.clock, plan), lambda done: sim.release(ticket, completed=done), headers, MEDIA_TYPE
        )
    await hold(sim, ticket)
    return JSONResponse(converse_response(ticket, call, result, req.stops), headers=headers)


async def _faulted(
    sim: Simulator, decision: Faulted, req: ConverseRequest, headers: dict[str, str], *, stream: bool
) -> Response | DropConnection:
    rule, ticket = decision.rule, decision.ticket
    broken = broken_call(req.tools, req.turn, TOOL_USE_PREFIX) if rule.mode is FaultMode.BROKEN_TOOL_ARGS else None

    def streamed(clock: Clock, call: ToolCall | None) -> AsyncIterator[bytes]:
        plan = StreamPlan(
            ticket,
            call,
            stops=req.stops,
            cut=rule.mode is FaultMode.STREAM_CUT,
            cut_after=rule.after if rule.mode is FaultMode.STREAM_CUT else 0,
            error_after=rule.after if rule.mode is FaultMode.STREAM_ERROR else None,
            error_dialect=rule.dialect,
        )
        return stream_events(clock, plan)

    def whole(call: ToolCall | None) -> bytes:
        return json.dumps(converse_response(ticket, call, stops=req.stops)).encode()

    return await faulted(
        sim,
        decision,
        stream=stream,
        call=_tool_call(req, decision.state.tools),
        broken=broken,
        streamed=streamed,
        answer=whole,
        on=Wire.BEDROCK,
        headers=headers,
        stream_type=MEDIA_TYPE,
    )


def routes() -> list[Route]:
    """bedrock-runtime's Converse routes (the id may be an ARN, with ``/`` encoded or not)."""
    return [
        Route("/model/{model_id:path}/converse", converse, methods=["POST"]),
        Route("/model/{model_id:path}/converse-stream", converse_stream, methods=["POST"]),
    ]
