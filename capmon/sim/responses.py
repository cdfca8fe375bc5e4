"""The OpenAI Responses API (``POST /v1/responses``), plain and streamed, on the same slots,
schedules, penalties, faults and capacity dialects as chat completions.

Shapes follow openai/openai-python's ``types/responses`` (Response, ResponseOutputMessage,
ResponseOutputText, ResponseUsage and the ResponseStreamEvent family). A stream is a series
of ``event: NAME`` / ``data: {...}`` frames, each with its ``sequence_number``:
response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta ..., response.output_text.done,
response.content_part.done, response.output_item.done, then response.completed (or
response.incomplete when ``max_output_tokens`` cut the answer short, as OpenAI does).

Function tools (``{"type": "function", "name", "parameters"}``) are called by the rule of
tools.py: the answer is then a ``function_call`` output item (streamed as
response.output_item.added, response.function_call_arguments.delta ...,
response.function_call_arguments.done, response.output_item.done), and an ``input`` that
ends with a ``function_call_output`` is answered in text that quotes the result.

A full model whose dialect is ``responses-failed`` / ``responses-slow-down`` /
``responses-error`` rejects inside a 200 stream: response.failed with error code
server_is_overloaded / slow_down, or an ``error`` event (the codes OpenAI's Codex client
treats as overload: openai/codex, codex-rs). Any other dialect answers with its HTTP error.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse

from capmon.core.base.clock import Clock
from capmon.core.providers.tokens import tokens_for_chars
from capmon.sim import dialects, structured
from capmon.sim.dialects import Api, Wire
from capmon.sim.faults import HANG_SECONDS, HTML_500_PAGE, PACED, STREAMED, DropConnection, FaultMode, delayed
from capmon.sim.model import Admitted, Faulted, Simulator, Ticket
from capmon.sim.replies import OPENAI_VIA, BadRequest, SlotStream, Via, hold, read_request, rejection, wire
from capmon.sim.resume import resumed, with_resume
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
    parse_response_tools,
)
from capmon.sim.usage import reported

MIN_OUTPUT_TOKENS = 16  # the Responses API refuses a smaller max_output_tokens


@dataclass(frozen=True)
class ResponsesRequest:
    model: str
    prompt_tokens: int
    max_output_tokens: int | None
    stream: bool
    instructions: str | None
    tools: ToolRequest | None = None
    turn: LastTurn | None = None
    echo_tools: tuple[Any, ...] = ()  # the request's tools and tool_choice, echoed in the response
    echo_choice: Any = "auto"
    resume: str | None = None  # the partial answer it asks the model to go on with (capmon/sim/resume.py)
    output: Output | None = None  # the JSON it asks for (capmon/sim/structured.py)
    echo_format: Any = None  # its text.format, echoed in the response


# Input items that carry a tool's result back to the model.
RESULT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


# A message item's role -> who it speaks for (any other role is the model's).
_VOICES = {"user": Voice.USER, "system": Voice.ASIDE, "developer": Voice.ASIDE}


def _voice(item: dict[str, Any]) -> tuple[Voice, Any]:
    kind = item.get("type", "message")
    if kind in RESULT_ITEMS:
        return Voice.RESULT, item.get("output")
    if kind == "message":
        return _VOICES.get(str(item.get("role")), Voice.MODEL), item.get("content")
    return Voice.MODEL, None  # the model's calls and reasoning


def last_turn(given: str | list[dict[str, Any]]) -> LastTurn | None:
    """The user's words or the tools' results the input ends with (tools.closing_turn)."""
    if isinstance(given, str):
        return LastTurn(given)
    return closing_turn(_voice(item) for item in reversed(given))


def _text_of(value: Any) -> int:
    """Characters of text in an ``input`` (a string, or a list of items / content parts)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_of(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_of(value.get(k)) for k in ("content", "text"))
    return 0


def parse_responses(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("Missing required parameter: 'model'.", "model")
    given = body.get("input")
    if not isinstance(given, (str, list)) or (isinstance(given, list) and not all(isinstance(i, dict) for i in given)):
        raise BadRequest("Invalid 'input': expected a string or an array of input items.", "input", model)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("Invalid 'instructions': expected a string.", "instructions", model)
    cap = body.get("max_output_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)):
        raise BadRequest(
            f"Invalid type for 'max_output_tokens': expected an integer, got {cap!r}.", "max_output_tokens", model
        )
    if cap is not None and cap < MIN_OUTPUT_TOKENS:
        raise BadRequest(
            f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= "
            f"{MIN_OUTPUT_TOKENS}, but got {cap} instead.",
            "max_output_tokens",
            model,
        )
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequest(f"Invalid 'stream': expected a boolean, got {stream!r}.", "stream", model)
    try:
        tools = parse_response_tools(body)
        output = structured.parse_responses(body)
    except (ToolError, OutputError) as e:
        raise BadRequest(str(e), e.param, model) from None
    chars = _text_of(given) + len(instructions or "")
    return ResponsesRequest(
        model,
        tokens_for_chars(chars),
        cap,
        stream,
        instructions,
        tools,
        last_turn(given),
        tuple(body.get("tools") or ()),
        body.get("tool_choice") or "auto",
        resumed(given)[0] if isinstance(given, list) else None,
        output,
        body["text"].get("format") if isinstance(body.get("text"), dict) else None,
    )


def tool_call(req: ResponsesRequest, mode: str) -> ToolCall | None:
    tool = req.tools.wants_call(mode, req.turn) if req.tools is not None else None
    return None if tool is None else make_call(tool)


# ---------------------------------------------------------------- shapes


def _ids(ticket: Ticket) -> tuple[str, str]:
    return f"resp_sim{ticket.id:016d}", f"msg_sim{ticket.id:016d}"


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _function_call(ticket: Ticket, call: ToolCall, status: str, arguments: str) -> dict[str, Any]:
    """ResponseFunctionToolCall: ``id`` is the item's, ``call_id`` what function_call_output answers."""
    return {
        "id": f"fc_sim{ticket.id:016d}",
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call.id,
        "name": call.name,
    }


def _message(ticket: Ticket, status: str, text: str | None) -> dict[str, Any]:
    return {
        "id": _ids(ticket)[1],
        "type": "message",
        "status": status,
        "content": [] if text is None else [_part(text)],
        "role": "assistant",
    }


def response_object(
    ticket: Ticket,
    req: ResponsesRequest,
    created: int,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: bool,
    error: dict[str, Any] | None = None,
    output_tokens: int | None = None,
) -> dict[str, Any]:
    completion = ticket.completion_tokens if output_tokens is None else output_tokens
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": _ids(ticket)[0],
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": None,
        "model": ticket.model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": req.echo_format or {"type": "text"}, "verbosity": "medium"},
        "tool_choice": req.echo_choice,
        "tools": list(req.echo_tools),
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": None
        if not usage
        else reported(
            {
                "input_tokens": ticket.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": ticket.prompt_tokens + completion,
            },
            ticket.usage,
        ),
        "user": None,
        "metadata": {},
    }


def final_status(ticket: Ticket) -> str:
    return "incomplete" if ticket.finish_reason == "length" else "completed"


def complete_response(
    ticket: Ticket, req: ResponsesRequest, created: int, call: ToolCall | None = None
) -> dict[str, Any]:
    if call is not None:
        item = _function_call(ticket, call, "completed", call.arguments)
        spent = tokens_of(call.arguments)
        return response_object(ticket, req, created, status="completed", usage=True, output=[item], output_tokens=spent)
    status = final_status(ticket)
    text = " ".join(answer_text(ticket, req.turn.tool_result if req.turn is not None else None))
    return response_object(ticket, req, created, status=status, usage=True, output=[_message(ticket, status, text)])


class _Events:
    """Numbers the events of one stream."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, name: str, **fields: Any) -> bytes:
        payload = {"type": name, "sequence_number": self.n, **fields}
        self.n += 1
        return f"event: {name}\ndata: ".encode() + json.dumps(payload).encode() + b"\n\n"


def _failure(
    event: _Events, dialect: str, ticket: Ticket, req: ResponsesRequest, created: int, output: list[dict[str, Any]]
) -> bytes:
    code, message = dialects.responses_failure(dialect)
    if dialect == dialects.RESPONSES_ERROR:
        return event("error", code=code, message=message, param=None)
    failed = response_object(
        ticket, req, created, status="failed", output=output, usage=False, error={"code": code, "message": message}
    )
    return event("response.failed", response=failed)


async def response_stream(
    clock: Clock,
    ticket: Ticket,
    req: ResponsesRequest,
    created: int,
    *,
    call: ToolCall | None = None,
    cut: bool = False,
    error_after: int | None = None,
    error_dialect: str = dialects.RESPONSES_FAILED,
    cut_after: int = 0,
) -> AsyncIterator[bytes]:
    event = _Events()
    _, item_id = _ids(ticket)
    started = response_object(ticket, req, created, status="in_progress", output=[], usage=False)
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    await clock.sleep(ticket.first_token)
    if error_after == 0:
        yield _failure(event, error_dialect, ticket, req, created, [])
        return
    if call is not None:
        async for frame in _call_events(clock, event, ticket, req, created, call, cut, error_after, error_dialect):
            yield frame
        return
    yield event("response.output_item.added", output_index=0, item=_message(ticket, "in_progress", None))
    at = {"item_id": item_id, "output_index": 0, "content_index": 0}
    yield event("response.content_part.added", **at, part=_part(""))
    pieces, costs = answer_pieces(ticket, req.turn.tool_result if req.turn is not None else None)
    text = ""
    for i, delta in enumerate(pieces):
        if cut and i >= (cut_after or len(pieces) // 2):
            return  # the stream just stops: no response.completed
        await clock.sleep(ticket.per_token * costs[i])
        text += delta
        yield event("response.output_text.delta", **at, delta=delta, logprobs=[])
        if error_after is not None and i + 1 >= error_after:
            break
    if error_after is not None:
        yield _failure(event, error_dialect, ticket, req, created, [_message(ticket, "incomplete", text)])
        return
    status = final_status(ticket)
    yield event("response.output_text.done", **at, text=text, logprobs=[])
    yield event("response.content_part.done", **at, part=_part(text))
    item = _message(ticket, status, text)
    yield event("response.output_item.done", output_index=0, item=item)
    done = response_object(ticket, req, created, status=status, output=[item], usage=True)
    yield event("response.completed" if status == "completed" else "response.incomplete", response=done)


async def _call_events(
    clock: Clock,
    event: _Events,
    ticket: Ticket,
    req: ResponsesRequest,
    created: int,
    call: ToolCall,
    cut: bool,
    error_after: int | None,
    error_dialect: str,
) -> AsyncIterator[bytes]:
    """A function_call output item, its arguments in several deltas, then response.completed."""
    added = _function_call(ticket, call, "in_progress", "")
    yield event("response.output_item.added", output_index=0, item=added)
    at = {"item_id": added["id"], "output_index": 0}
    pieces = argument_pieces(call.arguments)
    sent = ""
    for i, piece in enumerate(pieces):
        if cut and i >= len(pieces) // 2:
            return  # the stream just stops: no response.completed
        await clock.sleep(ticket.per_token * tokens_of(piece))
        sent += piece
        yield event("response.function_call_arguments.delta", **at, delta=piece)
        if error_after is not None and i + 1 >= error_after:
            break
    if error_after is not None:
        partial = [_function_call(ticket, call, "incomplete", sent)]
        yield _failure(event, error_dialect, ticket, req, created, partial)
        return
    yield event("response.function_call_arguments.done", **at, arguments=call.arguments)
    item = _function_call(ticket, call, "completed", call.arguments)
    yield event("response.output_item.done", output_index=0, item=item)
    spent = tokens_of(call.arguments)
    done = response_object(ticket, req, created, status="completed", output=[item], usage=True, output_tokens=spent)
    yield event("response.completed", response=done)


async def rejection_stream(
    dialect: str, model: str, req: ResponsesRequest, ticket: Ticket, created: int
) -> AsyncIterator[bytes]:
    """A 200 stream that starts a response and fails it at once for capacity."""
    event = _Events()
    started = response_object(ticket, req, created, status="in_progress", output=[], usage=False)
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    yield _failure(event, dialect, ticket, req, created, [])


# ---------------------------------------------------------------- the endpoint


def _stub_ticket(req: ResponsesRequest) -> Ticket:
    """Ids and usage for a response that fails before any work (it holds no slot)."""
    return Ticket(
        id=0,
        model=req.model,
        key="",
        prompt_tokens=req.prompt_tokens,
        completion_tokens=0,
        finish_reason="stop",
        first_token=0.0,
        per_token=0.0,
    )


async def create_response(request: Request) -> Response:
    return await serve_response(request, OPENAI_VIA)


async def serve_response(request: Request, via: Via) -> Response:
    """The Responses API, reached through OpenAI's URL or one of Azure's (``via``)."""
    read = await read_request(
        request,
        lambda body: parse_responses(via.body(body)),
        "We could not parse the JSON body of your request.",
        via.wire,
    )
    if isinstance(read, Response):
        return read
    sim, alias, req = read
    decision = sim.submit(
        alias,
        req.model,
        prompt_tokens=req.prompt_tokens,
        max_tokens=req.max_output_tokens,
        stream=req.stream,
        api=Api.RESPONSES,
        wire=via.wire,
        tools=may_call(req.tools, req.turn),
    )
    decision = with_output(with_resume(decision, req.resume), req.output, sim, req.turn)
    created = int(sim.clock.wall())
    refused = rejection(
        decision,
        api=Api.RESPONSES,
        stream=req.stream,
        in_stream=lambda d, m: rejection_stream(d, m, req, _stub_ticket(req), created),
        on=via.wire,
        now=sim.clock.wall(),
        api_version=via.api_version,
    )
    if refused is not None:
        return refused
    if isinstance(decision, Faulted):
        return await _faulted(sim, decision, req, created, via.wire)
    assert isinstance(decision, Admitted)
    ticket = decision.ticket
    call = tool_call(req, sim.state(req.model).tools)
    if req.stream:
        return SlotStream(
            response_stream(sim.clock, ticket, req, created, call=call),
            lambda done: sim.release(ticket, completed=done),
            {},
        )
    await hold(sim, ticket)
    return JSONResponse(complete_response(ticket, req, created, call))


async def _faulted(sim: Simulator, decision: Faulted, req: ResponsesRequest, created: int, on: Wire) -> Response:
    rule, ticket = decision.rule, decision.ticket
    broken = broken_call(req.tools, req.turn) if rule.mode is FaultMode.BROKEN_TOOL_ARGS else None
    if rule.mode in STREAMED or (broken is not None and req.stream) or (rule.mode in PACED and req.stream):
        error_after = rule.after if rule.mode is FaultMode.STREAM_ERROR else None
        return StreamingResponse(
            response_stream(
                rule.clock(sim.clock),
                ticket,
                req,
                created,
                call=broken or tool_call(req, decision.state.tools),
                cut=rule.mode is FaultMode.STREAM_CUT,
                cut_after=rule.after if rule.mode is FaultMode.STREAM_CUT else 0,
                error_after=error_after,
                error_dialect=rule.dialect,
            ),
            media_type="text/event-stream",
        )
    if rule.mode is FaultMode.SLOW_FIRST_TOKEN:  # headers now, the answer (its first token) later
        body = json.dumps(complete_response(ticket, req, created, tool_call(req, decision.state.tools))).encode()
        return StreamingResponse(delayed(sim.clock, rule.seconds, body), media_type="application/json")
    if rule.mode is FaultMode.HANG:
        await sim.clock.sleep(HANG_SECONDS)
        return PlainTextResponse("Gateway Timeout", status_code=504)
    if rule.mode is FaultMode.ERROR:
        return wire(dialects.status_error(rule.status, on))
    await sim.clock.sleep(ticket.first_token)
    if broken is not None:
        return JSONResponse(complete_response(ticket, req, created, broken))
    if rule.mode is FaultMode.RESET:
        return DropConnection()  # type: ignore[return-value]
    if rule.mode is FaultMode.TRUNCATE:
        body = json.dumps(complete_response(ticket, req, created)).encode()
        return Response(body[: len(body) // 2], media_type="application/json")
    if rule.mode is FaultMode.INVALID_JSON:
        return Response(b"not json", media_type="application/json")
    return HTMLResponse(HTML_500_PAGE, status_code=500)
