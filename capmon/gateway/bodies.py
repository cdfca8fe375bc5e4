"""What a client asked for: the JSON body of a chat-completions, Responses, Anthropic
Messages or Gemini generateContent request,
checked as far as the gateway and the core read it (the rest passes to the provider
untouched), and the per-request headers ``x-capmon-deadline``, ``x-capmon-priority``,
``x-capmon-first-token-timeout`` and ``x-capmon-continue``. Each field has its one strict parser in
capmon/gateway/fields.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capmon.core.providers.gemini_format import json_names
from capmon.core.types.config import AnthropicVersion
from capmon.core.types.result import Format, Priority, Request
from capmon.gateway import fields
from capmon.gateway.auth import Caller
from capmon.gateway.models import ModelNames

if TYPE_CHECKING:
    from capmon.gateway.errors import Shaper
    from capmon.gateway.sse import Framing

DEADLINE_HEADER = "x-capmon-deadline"
FIRST_TOKEN_HEADER = "x-capmon-first-token-timeout"  # seconds to the first output; 0: none
CONTINUE_HEADER = "x-capmon-continue"  # false: a stream that breaks after output is not continued
BETA_HEADER = "anthropic-beta"  # forwarded to Anthropic-wire targets of a same-format request
PRIORITY_HEADER = "x-capmon-priority"
VERSION_HEADER = "anthropic-version"


@dataclass(frozen=True, slots=True)
class Wanted:
    """A request the gateway will route."""

    request: Request
    stream: bool
    priority: Priority
    # A stream framed otherwise than its API's face frames it (Google's stream without
    # ``alt=sse``: one JSON array); None: the face's.
    framing: Callable[[], Framing] | None = None
    # Its errors shaped otherwise than its API's face shapes them (Anthropic's Messages on
    # Bedrock's InvokeModel: Bedrock's errors, which boto3 and AnthropicBedrock both read);
    # None: the face's.
    errors: Shaper | None = None


@dataclass(frozen=True, slots=True)
class Asked:
    """What a proxied request came with besides its body, and what the gateway adds."""

    headers: Mapping[str, str]  # by lower-case name
    caller: Caller
    names: ModelNames
    deadline: float | None = None  # the gateway's default, unless x-capmon-deadline says
    request_id: str | None = None  # the exchange's


def _deadline(asked: Asked) -> float | None:
    """The request's own deadline (``x-capmon-deadline``), else the gateway's."""
    own = fields.seconds(asked.headers.get(DEADLINE_HEADER), DEADLINE_HEADER)
    return own if own is not None else asked.deadline


def _first_token(asked: Asked) -> float | None:
    """The request's own first-token limit (``x-capmon-first-token-timeout``), else the config's."""
    return fields.seconds(asked.headers.get(FIRST_TOKEN_HEADER), FIRST_TOKEN_HEADER, zero=True)


def _continuation(asked: Asked) -> bool | None:
    """``x-capmon-continue``: false opts the request out of continuing a broken stream."""
    return fields.truth(asked.headers.get(CONTINUE_HEADER), CONTINUE_HEADER)


def _priority(asked: Asked) -> Priority:
    wanted = fields.choice(asked.headers.get(PRIORITY_HEADER), PRIORITY_HEADER, Priority)
    if asked.caller.priority is Priority.BATCH or wanted is Priority.BATCH:  # a batch key's requests stay batch
        return Priority.BATCH
    return Priority.INTERACTIVE


def _model(body: Mapping[str, Any], names: ModelNames) -> str | None:
    if "model" not in body:
        raise fields.bad("you must provide a model parameter", "model", "missing_required_parameter")
    model = fields.string(body, "model")
    if model is None:
        raise fields.bad("model: expected a string, got null", "model")
    return names.resolve(model)


def chat(body: dict[str, Any], asked: Asked) -> Wanted:
    """A chat-completions request. Every field but model, messages, stream, n and the
    token cap reaches the provider untouched."""
    model = _model(body, asked.names)
    messages = fields.messages(body)
    n = body.get("n")
    if n is not None and n != 1:
        raise fields.bad(f"n: this gateway answers with one choice (n = 1), got {n!r}"[:200], "n")
    cap = fields.positive_int(body, "max_completion_tokens") or fields.positive_int(body, "max_tokens")
    temperature = fields.number(body, "temperature")
    stream = fields.flag(body, "stream")
    priority = _priority(asked)
    extra = {
        k: v
        for k, v in body.items()
        if k not in ("model", "messages", "stream", "n", "max_tokens", "max_completion_tokens", "temperature")
    }
    request = Request.of(
        messages,
        model=model,
        max_tokens=cap,
        temperature=temperature,
        priority=priority,
        deadline=_deadline(asked),
        request_id=asked.request_id,
        first_token_timeout=_first_token(asked),
        continuation=_continuation(asked),
        extra=extra,
    )
    return Wanted(request, stream, priority)


def responses(body: dict[str, Any], asked: Asked) -> Wanted:
    """A Responses API request: the body goes as it is, but model, stream and the cap."""
    model = _model(body, asked.names)
    fields.response_input(body)
    fields.string(body, "instructions")
    stream = fields.flag(body, "stream")
    fields.positive_int(body, "max_output_tokens")
    return _in_format(Format.RESPONSES, body, asked, model, stream)


def anthropic_version(headers: Mapping[str, str]) -> AnthropicVersion | None:
    """The caller's ``anthropic-version``: either version is served alike (the target's own
    version decides what it refuses: ``[client] refused_sampling``); an unknown one is a 400
    naming the header, a missing one is taken as the current version's client."""
    return fields.choice(headers.get(VERSION_HEADER), VERSION_HEADER, AnthropicVersion)


def _anthropic_fields(body: Mapping[str, Any], names: ModelNames, headers: Mapping[str, str]) -> str | None:
    """The checks a Messages and a count_tokens body share; the model to try first."""
    anthropic_version(headers)
    model = _model(body, names)
    fields.anthropic_messages(body)
    fields.anthropic_system(body)
    fields.objects(body, "tools")
    fields.typed_object(body, "tool_choice")
    fields.typed_object(body, "thinking")
    return model


def messages(body: dict[str, Any], asked: Asked) -> Wanted:
    """An Anthropic Messages request: the body goes as it is (translated for a target on
    another wire), but model, stream and max_tokens, which the API requires."""
    model = _anthropic_fields(body, asked.names, asked.headers)
    fields.required_positive_int(body, "max_tokens")
    stream = fields.flag(body, "stream")
    for name in ("temperature", "top_p"):
        fields.number(body, name)
    fields.positive_int(body, "top_k")
    fields.strings(body, "stop_sequences")
    betas = fields.betas(asked.headers.get(BETA_HEADER), BETA_HEADER)
    return _in_format(Format.MESSAGES, body, asked, model, stream, betas=betas)


def count_tokens(body: dict[str, Any], headers: Mapping[str, str], names: ModelNames) -> dict[str, Any]:
    """A count_tokens body (a Messages body without max_tokens), checked like one."""
    _anthropic_fields(body, names, headers)
    return body


def gemini(body: dict[str, Any], asked: Asked, *, model: str, stream: bool) -> Wanted:
    """A Gemini generateContent request: the model and whether it streams come from its
    path (``/v1beta/models/{model}:streamGenerateContent``); the body goes as it is
    (translated for a target on another wire), but the token cap
    (``generationConfig.maxOutputTokens``) and ``candidateCount``, which capmon owns. A
    field may come under its proto name (``generation_config``), as Google's servers take it."""
    body = json_names(body)
    if not isinstance(body.get("contents"), list):
        raise fields.bad("contents: expected a list of contents", "contents")
    config = body.get("generationConfig")
    if config is not None:
        if not isinstance(config, dict):
            raise fields.bad("generationConfig: expected an object", "generationConfig")
        fields.positive_int(config, "maxOutputTokens")
        count = config.get("candidateCount")
        if count is not None and count != 1:
            raise fields.bad(
                f"generationConfig.candidateCount: this gateway answers with one candidate, got {count!r}"[:200],
                "generationConfig.candidateCount",
            )
        fields.number(config, "temperature")
        fields.strings(config, "stopSequences")
    return _in_format(Format.GEMINI, body, asked, asked.names.resolve(model), stream)


def converse(body: dict[str, Any], asked: Asked, *, model: str, stream: bool) -> Wanted:
    """A Bedrock Converse request: the model and whether it streams come from its path
    (``/model/{modelId}/converse-stream``); the body goes as it is (translated for a target
    on another wire), but the token cap (``inferenceConfig.maxTokens``), which capmon owns."""
    if not isinstance(body.get("messages"), list):
        raise fields.bad("messages: expected a list of messages", "messages")
    config = body.get("inferenceConfig")
    if config is not None:
        if not isinstance(config, dict):
            raise fields.bad("inferenceConfig: expected an object", "inferenceConfig")
        fields.positive_int(config, "maxTokens")
        fields.number(config, "temperature")
        fields.number(config, "topP")
        fields.strings(config, "stopSequences")
    return _in_format(Format.CONVERSE, body, asked, asked.names.resolve(model), stream)


def _in_format(fmt: Format, body: dict[str, Any], asked: Asked, model: str | None, stream: bool, **kw: Any) -> Wanted:
    """A request in its own format (Responses, Messages, Gemini): the body as it came, routed
    with what the request's headers ask (``kw``: Messages' betas)."""
    priority = _priority(asked)
    request = Request.of_body(
        fmt,
        body,
        model=model,
        priority=priority,
        deadline=_deadline(asked),
        request_id=asked.request_id,
        first_token_timeout=_first_token(asked),
        continuation=_continuation(asked),
        **kw,
    )
    return Wanted(request, stream, priority)
