"""The simulated provider as an ASGI app: OpenAI's API (also on Azure's URLs), Anthropic's
Messages API, Google's Gemini API and Vertex AI, AWS Bedrock's Converse, that really run out of
capacity, plus admin endpoints to steer it. A model is served on the wire its scenario ``api``
names (openai, azure, anthropic, gemini, vertex, bedrock, gemini+vertex, anthropic+vertex,
anthropic+bedrock, anthropic+vertex+bedrock or all).

API (OpenAI format; key as ``Authorization: Bearer KEY``, ``api-key`` or ``x-api-key``):
  POST /v1/chat/completions   plain JSON, or SSE when "stream": true, framed per the model's
                              stream_style (openai, azure, openrouter, vllm, ollama; see
                              streams.py); tool calls when tool_choice asks for one, when
                              the last user message asks for a tool (see tools.py), or the
                              model's tools = "always" (tools = "none": a request with tools
                              gets 400 unsupported_parameter); max_tokens or max_completion_tokens
                              (a model with token_param = "max_completion_tokens" answers
                              max_tokens with 400 unsupported_parameter); a response_format
                              that asks for JSON gets a JSON document (structured.py, as on
                              every wire)
  POST /v1/responses          the Responses API, plain or streamed (see responses.py)
  GET  /v1/models, /v1/models/{name}   the OpenAI-wire models (with anthropic-version: the Anthropic ones, in its shape)
  Azure's URLs for the two POSTs above (see azure.py): /openai/deployments/{deployment}/chat/completions
                              and /openai/responses with ?api-version=..., /openai/v1/chat/completions,
                              /openai/v1/responses; Azure's 401, 404 DeploymentNotFound and 400s
  POST /v1/messages           Anthropic's Messages API, plain or streamed, anthropic-version 2026-10-21
                              or 2023-06-01 (see messages.py); POST /v1/messages/count_tokens
  POST /v1beta/models/{model}:generateContent, :streamGenerateContent, :countTokens (also /v1/...)
                              Google's Gemini API (see gemini.py); GET /v1beta/models[/{model}]
  POST /{v1,v1beta1}/projects/{p}/locations/{r}/publishers/{google,anthropic}/models/{model}:...
                              Vertex AI: Gemini's methods, Claude's rawPredict (see vertex.py)
  POST /model/{modelId}/converse, /model/{modelId}/converse-stream
                              AWS Bedrock's Converse and ConverseStream (see bedrock.py); also
                              /invoke and /invoke-with-response-stream with Anthropic's body
                              (bedrock_invoke.py)

A full model rejects at once in its dialect: an HTTP error (openai-429, openai-503, ...), or
inside a 200 stream (openrouter-stream, anthropic-stream, gemini-openai-stream, vllm-stream,
ollama-stream for chat; responses-failed, responses-slow-down, responses-error for the
Responses API; gemini-stream for Gemini's; bedrock-stream, bedrock-stream-503,
bedrock-stream-error and bedrock-stream-frame for Bedrock's ConverseStream; other requests
get the HTTP error such a frame stands for).

Admin (see admin.py: no key on loopback unless one is configured; a non-loopback address
needs the admin key, sent as ``Authorization: Bearer KEY`` or ``x-admin-key``, or --open-admin):
  GET    /admin/stats                 counters: totals, per model, per key (keys by hash)
  POST   /admin/reset                 zero the counters (live requests stay counted)
  GET    /admin/models/{name}         the model's state right now
  POST   /admin/models/{name}         {"slots": 0} {"latency_factor": 3} {"hint": 2.0 | null}
                                      {"dialect": "openai-503"} {"reset_schedule": true}
                                      {"stream_style": "azure"} {"tools": "always"}
                                      {"token_param": "max_completion_tokens"} {"unsupported_dialect": "azure"}
                                      {"usage": "huge"} (or negative, float, string; honest)
  POST   /admin/outage/{name}         {"duration": 30, "dialect": "capacity-text"?}
  GET    /admin/faults                the active fault rules
  POST   /admin/faults                {"mode": "reset", "count": 2} | {"mode": "hang", "rate": 0.1}
                                      | {"mode": "stream_error", "after": 3, "dialect": "vllm-stream"}
                                      | {"mode": "huge", "bytes": 100000000, "valid": false}
                                      | {"mode": "error", "status": 403} (in the wire's own shape)
                                      | {"mode": "broken_tool_args"} (a call whose arguments stop halfway)
                                      | {"mode": "slow_first_token", "seconds": 20} (headers now, token later)
                                      | {"mode": "stall", "tokens": 20, "seconds": 30} (streams)
                                      | {"mode": ..., "model": "sim-small", ...} | a list | {"mode": "off"}
  DELETE /admin/faults                switch faults off

Every response carries ``x-capmon-simulator: <scenario>`` so a probe can tell the
simulator from something else listening on the port.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capmon.core.base.clock import Clock
from capmon.core.providers.tokens import estimate_tokens
from capmon.sim import admin, azure, bedrock, bedrock_invoke, dialects, gemini, messages, responses, structured, vertex
from capmon.sim.admin import AdminGuard, AdminPolicy
from capmon.sim.dialects import Api, Wire
from capmon.sim.faults import HANG_SECONDS, HTML_500_PAGE, PACED, STREAMED, DropConnection, FaultMode, delayed
from capmon.sim.huge import huge_body, huge_stream
from capmon.sim.labels import label_for
from capmon.sim.model import Admitted, Faulted, Simulator, Ticket
from capmon.sim.replies import (
    OPENAI_VIA,
    BadRequest,
    SlotStream,
    Via,
    bearer,
    hold,
    read_request,
    rejection,
    simulator,
    wire,
)
from capmon.sim.resume import resumed, with_resume
from capmon.sim.scenario import Scenario, load_scenario
from capmon.sim.streams import FINGERPRINT, StreamPlan, answer_text, chat_stream, rejection_stream, tokens_of, usage
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
    parse_tools,
)

SIM_HEADER = "x-capmon-simulator"


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class ChatRequest:
    model: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    sent_max_tokens: bool = False  # the legacy `max_tokens` was sent (some models refuse it)
    tools: ToolRequest | None = None
    turn: LastTurn | None = None
    resume: str | None = None  # the partial answer it asks the model to go on with (capmon/sim/resume.py)
    output: Output | None = None  # the JSON it asks for (capmon/sim/structured.py)


# chat's roles -> who they speak for (any other role is the model's)
_VOICES = {"user": Voice.USER, "tool": Voice.RESULT, "system": Voice.ASIDE, "developer": Voice.ASIDE}


def last_turn(messages: list[dict[str, Any]]) -> LastTurn | None:
    """The user's words or the tools' results the conversation ends with (tools.closing_turn)."""
    return closing_turn((_VOICES.get(str(m.get("role")), Voice.MODEL), m.get("content")) for m in reversed(messages))


def parse_chat(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("'messages' must be a non-empty array of message objects.", "messages", model)
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(param)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadRequest(f"Invalid '{param}': expected an integer >= 1, got {max_tokens!r}.", param, model)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(f"Invalid 'stream': expected a boolean, got {stream!r}.", "stream", model)
    options = body.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    try:
        tools = parse_tools(body)
        output = structured.parse_chat(body)
    except (ToolError, OutputError) as e:
        raise BadRequest(str(e), e.param, model) from None
    return ChatRequest(
        model,
        estimate_tokens(messages),
        max_tokens,
        stream,
        include_usage,
        sent_max_tokens=body.get("max_tokens") is not None,
        tools=tools,
        turn=last_turn(messages),
        resume=resumed(messages)[0],
        output=output,
    )


# ---------------------------------------------------------------- answers


def _completion(
    ticket: Ticket,
    created: int,
    call: ToolCall | None = None,
    tool_result: str | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    if call is None:
        text = label if label is not None and ticket.structured is None else " ".join(answer_text(ticket, tool_result))
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        finish, completion = ticket.finish_reason, ticket.completion_tokens
    else:
        message = {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ],
        }
        finish, completion = "tool_calls", tokens_of(call.arguments)
    return {
        "id": f"chatcmpl-sim{ticket.id:010d}",
        "object": "chat.completion",
        "created": created,
        "model": ticket.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage(ticket, completion),
    }


def _tool_call(chat: ChatRequest, mode: str) -> ToolCall | None:
    tool = chat.tools.wants_call(mode, chat.turn) if chat.tools is not None else None
    return None if tool is None else make_call(tool)


# ---------------------------------------------------------------- endpoints


UNPARSABLE = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
    "HTTP library correctly. The OpenAI API expects a JSON payload.)"
)


async def chat_completions(request: Request) -> Response | DropConnection:
    return await serve_chat(request, OPENAI_VIA)


async def serve_chat(request: Request, via: Via) -> Response | DropConnection:
    """Chat completions, reached through OpenAI's URL or one of Azure's (``via``)."""
    read = await read_request(request, lambda body: parse_chat(via.body(body)), UNPARSABLE, via.wire)
    if isinstance(read, Response):
        return read
    sim, alias, chat = read
    decision = sim.submit(
        alias,
        chat.model,
        prompt_tokens=chat.prompt_tokens,
        max_tokens=chat.max_tokens,
        stream=chat.stream,
        sent_max_tokens=chat.sent_max_tokens,
        wire=via.wire,
        tools=may_call(chat.tools, chat.turn),
    )
    decision = with_output(with_resume(decision, chat.resume), chat.output, sim, chat.turn)
    refused = rejection(
        decision,
        api=Api.CHAT,
        stream=chat.stream,
        in_stream=rejection_stream,
        on=via.wire,
        now=sim.clock.wall(),
        api_version=via.api_version,
    )
    if refused is not None:
        return refused
    created = int(sim.clock.wall())
    if isinstance(decision, Faulted):
        return await _faulted(sim, decision, chat, created, via.wire)
    assert isinstance(decision, Admitted)
    ticket = decision.ticket
    state = sim.state(chat.model)
    call = _tool_call(chat, state.tools)
    headers = {"x-request-id": f"req_{secrets.token_hex(12)}"}
    result = chat.turn.tool_result if chat.turn is not None else None
    if chat.stream:
        plan = StreamPlan(
            ticket,
            created,
            style=state.stream_style,
            include_usage=chat.include_usage,
            tool_call=call,
            tool_result=result,
        )
        return SlotStream(chat_stream(sim.clock, plan), lambda done: sim.release(ticket, completed=done), headers)
    await hold(sim, ticket)
    # A classify prompt gets its label (capmon/sim/labels.py); the usage still counts the usual answer.
    said = chat.turn.text if chat.turn is not None and result is None and call is None else None
    label = label_for(state.labels, state.disagree, said)
    return JSONResponse(_completion(ticket, created, call, result, label), headers=headers)


async def _faulted(
    sim: Simulator, decision: Faulted, chat: ChatRequest, created: int, on: Wire
) -> Response | DropConnection:
    rule, ticket, state = decision.rule, decision.ticket, decision.state
    broken = broken_call(chat.tools, chat.turn) if rule.mode is FaultMode.BROKEN_TOOL_ARGS else None
    if rule.mode in STREAMED or (broken is not None and chat.stream) or (rule.mode in PACED and chat.stream):
        plan = StreamPlan(
            ticket,
            created,
            style=state.stream_style,
            include_usage=chat.include_usage,
            tool_call=broken or _tool_call(chat, state.tools),
            cut=rule.mode is FaultMode.STREAM_CUT,
            cut_after=rule.after if rule.mode is FaultMode.STREAM_CUT else 0,
            error_after=rule.after if rule.mode is FaultMode.STREAM_ERROR else None,
            error_dialect=rule.dialect,
        )
        return StreamingResponse(chat_stream(rule.clock(sim.clock), plan), media_type="text/event-stream")
    if rule.mode is FaultMode.SLOW_FIRST_TOKEN:  # headers now, the answer (its first token) later
        body = json.dumps(_completion(ticket, created, _tool_call(chat, state.tools))).encode()
        return StreamingResponse(delayed(sim.clock, rule.seconds, body), media_type="application/json")
    if rule.mode is FaultMode.HANG:
        await sim.clock.sleep(HANG_SECONDS)
        return PlainTextResponse("Gateway Timeout", status_code=504)
    if rule.mode is FaultMode.ERROR:
        return wire(dialects.status_error(rule.status, on))
    await sim.clock.sleep(ticket.first_token)
    if broken is not None:
        return JSONResponse(_completion(ticket, created, broken))
    if rule.mode is FaultMode.HUGE:
        if chat.stream:
            return StreamingResponse(
                huge_stream(ticket, created, rule.bytes, rule.valid), media_type="text/event-stream"
            )
        pieces, length = huge_body(ticket, created, rule.bytes, rule.valid)
        return StreamingResponse(pieces, media_type="application/json", headers={"content-length": str(length)})
    if rule.mode is FaultMode.RESET:
        return DropConnection()
    if rule.mode is FaultMode.TRUNCATE:
        body = json.dumps(_completion(ticket, created)).encode()
        return Response(body[: len(body) // 2], media_type="application/json")
    if rule.mode is FaultMode.INVALID_JSON:
        return Response(b"not json", media_type="application/json")
    return HTMLResponse(HTML_500_PAGE, status_code=500)


def _model_entry(name: str, created: int, on: Wire) -> dict[str, Any]:
    if on is Wire.ANTHROPIC:
        return {"type": "model", "id": name, "display_name": name, "created_at": dialects.rfc3339(created)}
    return {"id": name, "object": "model", "created": created, "owned_by": "capmon-sim"}


def _models_wire(request: Request) -> Wire:
    """GET /v1/models is OpenAI's, Anthropic's and Gemini's: the anthropic-version header, or
    a Google key (x-goog-api-key, ?key=), says whose."""
    if "x-goog-api-key" in request.headers or "key" in request.query_params:
        return Wire.GEMINI
    return Wire.ANTHROPIC if messages.VERSION_HEADER in request.headers else Wire.OPENAI


async def list_models(request: Request) -> Response:
    sim = simulator(request)
    on = _models_wire(request)
    if on is Wire.GEMINI:
        return await gemini.list_models(request)
    token = bearer(request, on)
    if not sim.is_accepted(token):
        return wire(dialects.invalid_api_key(token, on))
    created = int(sim.clock.wall())
    data = [_model_entry(n, created, on) for n in sim.model_names(on)]
    if on is Wire.ANTHROPIC:
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return JSONResponse({"data": data, "has_more": False, "first_id": first, "last_id": last})
    return JSONResponse({"object": "list", "data": data})


async def get_model(request: Request) -> Response:
    sim = simulator(request)
    on = _models_wire(request)
    if on is Wire.GEMINI:
        return await gemini.get_model(request)
    token = bearer(request, on)
    if not sim.is_accepted(token):
        return wire(dialects.invalid_api_key(token, on))
    name = request.path_params["name"]
    if not sim.has_model(name, on):
        return wire(dialects.model_not_found(name, on))
    return JSONResponse(_model_entry(name, int(sim.clock.wall()), on))


async def index(request: Request) -> Response:
    sim = simulator(request)
    policy: AdminPolicy = request.app.state.admin
    return PlainTextResponse(
        f"capmon simulated provider, scenario {sim.scenario.name!r}.\n"
        f"OpenAI API under /v1: POST /v1/chat/completions, POST /v1/responses, GET /v1/models "
        f"(models: {', '.join(sim.model_names(Wire.OPENAI)) or 'none'}).\n"
        f"Azure OpenAI under /openai: /openai/deployments/{{deployment}}/chat/completions?api-version=..., "
        f"/openai/v1/... (deployments: {', '.join(sim.model_names(Wire.AZURE)) or 'none'}).\n"
        f"Anthropic's Messages API: POST /v1/messages, POST /v1/messages/count_tokens "
        f"(models: {', '.join(sim.model_names(Wire.ANTHROPIC)) or 'none'}).\n"
        f"Gemini API: POST /v1beta/models/{{model}}:generateContent, :streamGenerateContent?alt=sse, :countTokens "
        f"(also under /v1; models: {', '.join(sim.model_names(Wire.GEMINI)) or 'none'}).\n"
        f"Vertex AI: POST /v1/projects/{{p}}/locations/{{r}}/publishers/google/models/{{model}}:generateContent, "
        f".../publishers/anthropic/models/{{model}}:rawPredict (also under /v1beta1; "
        f"models: {', '.join(sim.model_names(Wire.VERTEX)) or 'none'}).\n"
        f"AWS Bedrock: POST /model/{{modelId}}/converse, /converse-stream, /invoke, /invoke-with-response-stream "
        f"(models: {', '.join(sim.model_names(Wire.BEDROCK)) or 'none'}).\n{policy.describe()}.\n"
    )


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


def create_app(
    scenario: Scenario | str | os.PathLike[str] = "demo",
    *,
    clock: Clock | None = None,
    simulator: Simulator | None = None,
    admin_policy: AdminPolicy | None = None,
) -> Starlette:
    """The simulator app. ``scenario`` is a Scenario, a bundled name or a path; ``clock``
    defaults to loop time, so a fast-forwarded loop fast-forwards the simulator too.
    ``admin_policy`` (default: loopback, no key) says how /admin is protected."""
    if simulator is None:
        scn = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        simulator = Simulator(scn, clock)
    policy = admin_policy or AdminPolicy()
    routes = [
        Route("/", index),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", responses.create_response, methods=["POST"]),
        Route("/v1/messages", messages.create_message, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        *azure.routes(serve_chat, responses.serve_response),
        *gemini.routes(),
        *vertex.routes(),
        *bedrock.routes(),
        *bedrock_invoke.routes(),
        Route("/v1/models", list_models),
        Route("/v1/models/{name:path}", get_model),
        *admin.ROUTES,
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_TagResponses, name=simulator.scenario.name), Middleware(AdminGuard, policy=policy)],
    )
    app.state.simulator = simulator
    app.state.admin = policy
    return app


def simulator_of(app: Starlette) -> Simulator:
    sim: Simulator = app.state.simulator
    return sim


__all__ = ["ChatRequest", "SIM_HEADER", "create_app", "estimate_tokens", "parse_chat", "simulator_of"]
