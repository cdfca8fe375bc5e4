"""Google's Gemini API, ``POST /{v1,v1beta}/models/{model}:generateContent``,
``:streamGenerateContent`` and ``:countTokens`` (and ``GET /v1beta/models[/{model}]``), on
the same slots, schedules, penalties, faults and capacity dialects as the other APIs. The
same handlers answer Vertex AI's URLs for Google's models (capmon/sim/vertex.py). Only
models whose scenario ``api`` serves the wire (gemini or vertex, gemini+vertex, all) are
served; any other name is Google's 404.

On the Gemini API the key is ``x-goog-api-key`` or ``?key=`` (a wrong one is Google's 400
INVALID_ARGUMENT with reason API_KEY_INVALID, none a 403). Shapes follow google-genai's
types: a GenerateContentResponse is ``candidates[{content{role: "model", parts}, finishReason,
index}]``, ``usageMetadata``, ``modelVersion``, ``responseId``; finishReason STOP (a function
call's too), MAX_TOKENS when ``generationConfig.maxOutputTokens`` cut the answer, STOP
before the first of ``stopSequences`` the answer would say (left out, as Gemini does), and
MALFORMED_FUNCTION_CALL (no content) for a broken_tool_args fault's call.

A stream is GenerateContentResponse chunks, a piece of text each (a function call whole in
one), the last with finishReason and usageMetadata: SSE with ``?alt=sse`` (``data:`` events
apart by ``\\r\\n\\r\\n``), else one JSON array whose elements come as they are made. A model
whose dialect is ``gemini-stream`` rejects inside the 200 stream with Google's error object,
raw and pretty-printed, no ``data:`` (dialects.gemini_stream_error); the ``stream_error``
fault sends it after ``after`` chunks (0: before any).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from capmon.core.base.clock import Clock
from capmon.core.providers.tokens import estimate_body
from capmon.core.types.result import Format
from capmon.sim import dialects, structured
from capmon.sim.dialects import Api, Wire
from capmon.sim.faults import DropConnection, FaultMode
from capmon.sim.model import Admitted, Faulted, Simulator, Ticket
from capmon.sim.replies import BadRequest, SlotStream, bearer, faulted, hold, read_request, rejection, simulator, wire
from capmon.sim.resume import resumed, with_resume
from capmon.sim.streams import answer_pieces, tokens_of, until_stop
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
    parse_gemini_tools,
    text_of,
)
from capmon.sim.usage import reported

GENERATE = "generateContent"
STREAM = "streamGenerateContent"
COUNT = "countTokens"
METHODS = (GENERATE, STREAM, COUNT)
UNPARSABLE = "Invalid JSON payload received. Unexpected token."
# A part carries exactly one of these (google.ai.generativelanguage Part's `data` oneof).
PART_DATA = (
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
)
ROLES = ("user", "model", "function")  # "function": how older clients sent function responses
MAX_STOP_SEQUENCES = 5
# finish_reason of a Ticket -> Gemini's finishReason
FINISH_REASONS = {"stop": "STOP", "length": "MAX_TOKENS"}
MALFORMED = "MALFORMED_FUNCTION_CALL"


@dataclass(frozen=True)
class GenerateRequest:
    model: str
    prompt_tokens: int
    max_tokens: int | None
    stops: tuple[str, ...] = ()
    tools: ToolRequest | None = None
    turn: LastTurn | None = None
    resume: str | None = None  # the partial answer it asks the model to go on with (capmon/sim/resume.py)
    output: Output | None = None  # the JSON it asks for (capmon/sim/structured.py)


def _fail(message: str, model: str, param: str | None = None) -> BadRequest:
    # Google lists each bad field as "* GenerateContentRequest.<field>: <why>".
    return BadRequest(f"* GenerateContentRequest.{message}\n", param, model)


def _result_text(part: dict[str, Any]) -> str:
    """A function response's text: its output when it says one, else its JSON."""
    response = part["functionResponse"].get("response") if isinstance(part["functionResponse"], dict) else None
    return text_of(response) or json.dumps(response)


def _voice(content: dict[str, Any]) -> tuple[Voice, Any]:
    """A content's voice and what it says: a user (or function) turn with functionResponse
    parts speaks for the tools (their results)."""
    parts = content["parts"]
    if content.get("role") == "model":
        return Voice.MODEL, parts
    results = [_result_text(p) for p in parts if "functionResponse" in p]
    return (Voice.RESULT, results) if results else (Voice.USER, parts)


def last_turn(contents: list[dict[str, Any]]) -> LastTurn | None:
    """The user's words or the functions' results the conversation ends with (tools.closing_turn)."""
    return closing_turn(_voice(c) for c in reversed(contents))


def _counted(part: dict[str, Any]) -> dict[str, Any]:
    """A part as the project's one estimate reads a chat content part (tokens.py)."""
    if isinstance(part.get("text"), str):
        return {"text": part["text"]}
    if isinstance(part.get("functionCall"), dict):
        return {"input": part["functionCall"].get("args") or {}}
    if "functionResponse" in part:
        return {"text": _result_text(part)}
    return {}


def prompt_tokens(body: dict[str, Any], contents: list[dict[str, Any]]) -> int:
    """The prompt as the project's one estimate counts it: each content a message, the
    system instruction one more, the function declarations as their JSON."""
    messages = [{"content": [_counted(p) for p in c["parts"]]} for c in contents]
    system = body.get("systemInstruction")
    if isinstance(system, dict) and isinstance(system.get("parts"), list):
        messages.insert(0, {"content": [_counted(p) for p in system["parts"] if isinstance(p, dict)]})
    return estimate_body(Format.CHAT, {"messages": messages, "tools": body.get("tools")})


def _contents(body: dict[str, Any], model: str) -> list[dict[str, Any]]:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _fail("contents: contents is not specified", model, "contents")
    for i, c in enumerate(contents):
        if not isinstance(c, dict):
            raise _fail(f"contents[{i}]: expected a Content object", model, "contents")
        if c.get("role", "user") not in ROLES:
            raise BadRequest("Please use a valid role: user, model.", "contents", model)
        parts = c.get("parts")
        if not isinstance(parts, list) or not parts:
            raise _fail(f"contents[{i}].parts: contents.parts must not be empty.", model, "contents")
        for j, p in enumerate(parts):
            if not isinstance(p, dict) or not any(k in p for k in PART_DATA):
                raise _fail(
                    f"contents[{i}].parts[{j}].data: required oneof field 'data' must have one initialized field",
                    model,
                    "contents",
                )
    return contents


def _generation(body: dict[str, Any], model: str) -> tuple[int | None, tuple[str, ...]]:
    """``generationConfig``'s maxOutputTokens and stopSequences."""
    config = body.get("generationConfig", {})
    if not isinstance(config, dict):
        raise _fail("generation_config: expected a GenerationConfig object", model, "generationConfig")
    limit = config.get("maxOutputTokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _fail(
            f"generation_config.max_output_tokens: must be a positive integer, got {limit!r}", model, "generationConfig"
        )
    stops = config.get("stopSequences", [])
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _fail("generation_config.stop_sequences: expected a list of strings", model, "generationConfig")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise _fail(
            f"generation_config.stop_sequences: at most {MAX_STOP_SEQUENCES} stop sequences are allowed",
            model,
            "generationConfig",
        )
    return limit, tuple(stops)


def parse_generate(body: Any, model: str, *, counting: bool = False) -> GenerateRequest:
    """A generateContent request for ``model`` (the URL's); ``counting``: a countTokens
    request, which may wrap it in ``generateContentRequest``. Raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest(UNPARSABLE, None, model)
    if counting and isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    contents = _contents(body, model)
    system = body.get("systemInstruction")
    if system is not None and not (isinstance(system, dict) and isinstance(system.get("parts"), list)):
        raise _fail("system_instruction: expected a Content object", model, "systemInstruction")
    limit, stops = _generation(body, model)
    try:
        tools = parse_gemini_tools(body)
        output = structured.parse_gemini(body)
    except (ToolError, OutputError) as e:
        raise BadRequest(str(e), e.param, model) from None
    conversation = [{"role": c.get("role", "user"), "content": c["parts"]} for c in contents]
    return GenerateRequest(
        model,
        prompt_tokens(body, contents),
        limit,
        stops,
        tools,
        last_turn(contents),
        resumed(conversation)[0],
        output,
    )


# ---------------------------------------------------------------- shapes


def response_id() -> str:
    return secrets.token_urlsafe(16)


def usage_metadata(prompt: int, output: int, report: str) -> dict[str, Any]:
    counts = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": prompt + output,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    return reported(counts, report)


def answer(ticket: Ticket, tool_result: str | None, stops: tuple[str, ...]) -> tuple[list[str], list[int], str]:
    """The answer's stream pieces, each one's tokens, and its finishReason: cut just before
    the first stop sequence it would say (then STOP, whatever maxOutputTokens said)."""
    pieces, costs = answer_pieces(ticket, tool_result)
    kept, kept_costs, stopped = until_stop(pieces, costs, stops)
    return kept, kept_costs, "STOP" if stopped else FINISH_REASONS[ticket.finish_reason]


def _call_candidate(call: ToolCall) -> dict[str, Any]:
    """A function call, whole; one whose arguments are not JSON (a broken_tool_args fault's)
    is what Gemini answers for a call it could not form: no content, MALFORMED_FUNCTION_CALL."""
    try:
        args = json.loads(call.arguments)
    except ValueError:
        message = f"Malformed function call: print(default_api.{call.name}({call.arguments}"
        return {"finishReason": MALFORMED, "finishMessage": message, "index": 0}
    return {"content": {"role": "model", "parts": [{"functionCall": {"name": call.name, "args": args}}]}, "index": 0}


def _text_candidate(text: str) -> dict[str, Any]:
    return {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}


def _pieces(
    ticket: Ticket, call: ToolCall | None, tool_result: str | None, stops: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[int], str]:
    """The candidates a stream sends one by one, each one's tokens, and the finishReason the
    last one gets (unless it has its own)."""
    if call is not None:
        return [_call_candidate(call)], [tokens_of(call.arguments)], "STOP"
    pieces, costs, reason = answer(ticket, tool_result, stops)
    return [_text_candidate(p) for p in pieces] or [_text_candidate("")], costs or [0], reason


def _finished(candidate: dict[str, Any], reason: str) -> dict[str, Any]:
    return candidate if "finishReason" in candidate else {**candidate, "finishReason": reason}


def generate_response(
    rid: str, ticket: Ticket, call: ToolCall | None, tool_result: str | None = None, stops: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A whole GenerateContentResponse; usage as the ticket's model reports it (capmon/sim/usage.py)."""
    if call is None:
        pieces, costs, reason = answer(ticket, tool_result, stops)
        candidate, output = _text_candidate("".join(pieces)), sum(costs)
    else:
        candidate, output, reason = _call_candidate(call), tokens_of(call.arguments), "STOP"
    return {
        "candidates": [_finished(candidate, reason)],
        "usageMetadata": usage_metadata(ticket.prompt_tokens, output, ticket.usage),
        "modelVersion": ticket.model,
        "responseId": rid,
    }


# A stream's items: a chunk (GenerateContentResponse), an error object's text (sent as it is),
# or END: the stream is whole (a stream cut short ends without it).
END = None
Item = dict[str, Any] | bytes | None


@dataclass(frozen=True)
class StreamPlan:
    """What one stream carries and how it ends."""

    rid: str
    ticket: Ticket
    call: ToolCall | None = None
    tool_result: str | None = None
    stops: tuple[str, ...] = ()
    cut: bool = False  # stop halfway (or after ``cut_after`` chunks): no finishReason
    cut_after: int = 0
    error_after: int | None = None  # this many chunks, then the error object


async def stream_items(clock: Clock, plan: StreamPlan) -> AsyncIterator[Item]:
    """The whole stream of one admitted (or faulted) request."""
    ticket = plan.ticket
    await clock.sleep(ticket.first_token)
    if plan.error_after == 0:
        yield dialects.gemini_stream_error()
        yield END
        return
    candidates, costs, reason = _pieces(ticket, plan.call, plan.tool_result, plan.stops)
    for i, candidate in enumerate(candidates):
        if plan.cut and i >= (plan.cut_after or len(candidates) // 2):
            return  # the stream just stops: no finishReason, no usage
        await clock.sleep(ticket.per_token * costs[i])
        chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": ticket.model, "responseId": plan.rid}
        if i == len(candidates) - 1 and plan.error_after is None:
            chunk["candidates"] = [_finished(candidate, reason)]
            chunk["usageMetadata"] = usage_metadata(ticket.prompt_tokens, sum(costs), ticket.usage)
        yield chunk
        if plan.error_after is not None and i + 1 >= plan.error_after:
            break
    if plan.error_after is not None:
        yield dialects.gemini_stream_error()  # after output: the stream fails, never a truncated success
    yield END


async def rejection_items() -> AsyncIterator[Item]:
    """A full model that says so inside a 200 stream, before any chunk."""
    yield dialects.gemini_stream_error()
    yield END


async def sse(items: AsyncIterator[Item]) -> AsyncIterator[bytes]:
    """``?alt=sse``: each chunk a ``data:`` event (Google ends them with CRLF CRLF); an error
    object goes out raw."""
    async for item in items:
        if isinstance(item, dict):
            yield b"data: " + json.dumps(item).encode() + b"\r\n\r\n"
        elif item is not END:
            yield item


async def json_array(items: AsyncIterator[Item]) -> AsyncIterator[bytes]:
    """Without alt=sse: one JSON array, each element sent as it is made; closed only when
    the stream is whole."""
    sep = b"["
    async for item in items:
        if item is END:
            yield b"]" if sep == b",\r\n" else b"[]"
            return
        yield sep + (json.dumps(item, indent=2).encode() if isinstance(item, dict) else item.rstrip())
        sep = b",\r\n"


# ---------------------------------------------------------------- endpoints


def split_call(call: str) -> tuple[str, str]:
    """``gemini-flash:generateContent`` -> (model, method)."""
    model, _, method = call.rpartition(":")
    return model, method


def _tool_call(req: GenerateRequest, mode: str) -> ToolCall | None:
    tool = req.tools.wants_call(mode, req.turn) if req.tools is not None else None
    return None if tool is None else make_call(tool)


async def call_model(request: Request) -> Response | DropConnection:
    """``POST /{v1,v1beta}/models/{model}:{method}`` on the Gemini API."""
    model, method = split_call(request.path_params["call"])
    return await serve(request, Wire.GEMINI, model, method)


async def serve(request: Request, on: Wire, model: str, method: str) -> Response | DropConnection:
    """One of the model's methods, reached through the Gemini API or Vertex AI (``on``)."""
    if method not in METHODS:
        return wire(dialects.status_error(404, on))
    counting = method == COUNT
    read = await read_request(request, lambda body: parse_generate(body, model, counting=counting), UNPARSABLE, on)
    if isinstance(read, Response):
        return read
    sim, alias, req = read
    if counting:
        if not sim.has_model(model, on):
            sim.bad_request(alias, model)
            return wire(dialects.model_not_found(model, on))
        details = [{"modality": "TEXT", "tokenCount": req.prompt_tokens}]
        return JSONResponse({"totalTokens": req.prompt_tokens, "promptTokensDetails": details})
    stream = method == STREAM
    framing: Callable[[AsyncIterator[Item]], AsyncIterator[bytes]] = (
        sse if request.query_params.get("alt") == "sse" else json_array
    )
    media = "text/event-stream" if framing is sse else "application/json"
    decision = sim.submit(
        alias,
        model,
        prompt_tokens=req.prompt_tokens,
        max_tokens=req.max_tokens,
        stream=stream,
        api=Api.GEMINI,
        wire=on,
        tools=may_call(req.tools, req.turn),
    )
    decision = with_output(with_resume(decision, req.resume), req.output, sim, req.turn)
    refused = rejection(
        decision,
        api=Api.GEMINI,
        stream=stream,
        in_stream=lambda _dialect, _model: framing(rejection_items()),
        on=on,
        now=sim.clock.wall(),
    )
    if refused is not None:
        return refused
    rid = response_id()
    result = req.turn.tool_result if req.turn is not None else None
    if isinstance(decision, Faulted):
        return await _faulted(sim, decision, req, rid, on, framing, media, stream=stream)
    assert isinstance(decision, Admitted)
    ticket = decision.ticket
    call = _tool_call(req, sim.state(model).tools)
    if stream:
        plan = StreamPlan(rid, ticket, call, result, req.stops)
        return SlotStream(
            framing(stream_items(sim.clock, plan)), lambda done: sim.release(ticket, completed=done), {}, media
        )
    await hold(sim, ticket)
    return JSONResponse(generate_response(rid, ticket, call, result, req.stops))


async def _faulted(
    sim: Simulator,
    decision: Faulted,
    req: GenerateRequest,
    rid: str,
    on: Wire,
    framing: Callable[[AsyncIterator[Item]], AsyncIterator[bytes]],
    media: str,
    *,
    stream: bool,
) -> Response | DropConnection:
    rule, ticket = decision.rule, decision.ticket
    broken = broken_call(req.tools, req.turn) if rule.mode is FaultMode.BROKEN_TOOL_ARGS else None

    def streamed(clock: Clock, call: ToolCall | None) -> AsyncIterator[bytes]:
        plan = StreamPlan(
            rid,
            ticket,
            call,
            stops=req.stops,
            cut=rule.mode is FaultMode.STREAM_CUT,
            cut_after=rule.after if rule.mode is FaultMode.STREAM_CUT else 0,
            error_after=rule.after if rule.mode is FaultMode.STREAM_ERROR else None,
        )
        return framing(stream_items(clock, plan))

    def whole(call: ToolCall | None) -> bytes:
        return json.dumps(generate_response(rid, ticket, call, stops=req.stops)).encode()

    return await faulted(
        sim,
        decision,
        stream=stream,
        call=_tool_call(req, decision.state.tools),
        broken=broken,
        streamed=streamed,
        answer=whole,
        on=on,
        headers={},
        stream_type=media,
    )


# ---------------------------------------------------------------- models


def model_entry(sim: Simulator, name: str) -> dict[str, Any]:
    """A Model of the Gemini API's models.list / models.get."""
    window = sim.state(name).context_window
    return {
        "name": f"models/{name}",
        "version": "001",
        "displayName": name,
        "description": f"{name}, served by capmon's simulator",
        "inputTokenLimit": window,
        "outputTokenLimit": window,
        "supportedGenerationMethods": [GENERATE, COUNT],
    }


async def list_models(request: Request) -> Response:
    sim = simulator(request)
    token = bearer(request, Wire.GEMINI)
    if not sim.is_accepted(token):
        return wire(dialects.invalid_api_key(token, Wire.GEMINI))
    return JSONResponse({"models": [model_entry(sim, n) for n in sim.model_names(Wire.GEMINI)]})


async def get_model(request: Request) -> Response:
    sim = simulator(request)
    token = bearer(request, Wire.GEMINI)
    if not sim.is_accepted(token):
        return wire(dialects.invalid_api_key(token, Wire.GEMINI))
    name = request.path_params["name"].removeprefix("models/")
    if not sim.has_model(name, Wire.GEMINI):
        return wire(dialects.model_not_found(name, Wire.GEMINI))
    return JSONResponse(model_entry(sim, name))


def routes() -> list[Route]:
    """The Gemini API's routes, under v1beta and v1 (google-genai 3.6 defaults to v1; GET
    /v1/models is also OpenAI's and Anthropic's: capmon/sim/app.py tells them apart)."""
    return [
        Route("/v1beta/models", list_models),
        Route("/v1beta/models/{name}", get_model),
        Route("/v1beta/models/{call}", call_model, methods=["POST"]),
        Route("/v1/models/{call}", call_model, methods=["POST"]),
    ]
