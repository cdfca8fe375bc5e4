"""The Anthropic dialect (``api = "anthropic"``): ``{base_url}/v1/messages``, which speaks
Messages whatever the caller's format; the key as ``x-api-key`` with ``anthropic-version``
(its own endpoint key); a Messages caller's ``anthropic-beta`` added to the endpoint's;
server-sent events. A module of :class:`capmon.core.providers.dialect.Dialect`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from capmon.core.providers import hub, openai_dialect
from capmon.core.providers.dialect import Auth, Headers
from capmon.core.providers.sse import SSEParser
from capmon.core.types.config import DEFAULT_VERSION, AnthropicVersion, DropRule, EndpointConfig, ModelConfig
from capmon.core.types.result import Format, Request

MESSAGES_PATH = "/v1/messages"
GENAI_PROVIDER = "anthropic"  # gen_ai.provider.name (OpenTelemetry's GenAI conventions)


def wire_of(caller: Format, model: str) -> Format:
    return Format.MESSAGES


def urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    return {Format.MESSAGES: endpoint.base_url.rstrip("/") + MESSAGES_PATH}


stream_urls = openai_dialect.stream_urls


def unserved(endpoint: EndpointConfig, wire: Format) -> str | None:
    return None


def auth(endpoint: EndpointConfig, secret: str) -> Auth:
    """``x-api-key``, which every version and every compatible server takes (see
    :func:`request_headers`), and the endpoint's ``anthropic-version``; no key header for a
    server that takes no key."""
    headers = request_headers(secret, endpoint.anthropic_version)
    return Auth(headers if secret else {k: v for k, v in headers.items() if k != "x-api-key"})


def request_headers(secret: str, version: AnthropicVersion = DEFAULT_VERSION) -> dict[str, str]:
    """The key and version headers. capmon sends ``x-api-key``: every version of the API
    and every Anthropic-compatible server takes it, while Bearer is only the 2026 SDKs'
    habit; one header for both versions keeps an endpoint's version a one-word change."""
    return {"x-api-key": secret, "anthropic-version": version.value}


def caller_headers(headers: Headers, request: Request) -> Headers | None:
    """A Messages caller's betas (``anthropic-beta``), added to the endpoint's own."""
    if request.betas and request.format is Format.MESSAGES:
        return with_betas(headers, request.betas)
    return None


def with_betas(headers: Headers, betas: tuple[str, ...]) -> Headers:
    """A target's headers with the caller's Anthropic betas added to the endpoint's own
    ``anthropic-beta`` (one header, the endpoint's first, each beta once)."""
    mine = [v.decode("latin-1") for k, v in headers if k == b"anthropic-beta"]
    names = [b.strip() for v in mine for b in v.split(",") if b.strip()]
    names += [b for b in betas if b not in names]
    rest = [(k, v) for k, v in headers if k != b"anthropic-beta"]
    return [*rest, (b"anthropic-beta", ",".join(names).encode("latin-1"))]


def framing() -> SSEParser:
    return SSEParser()


def has_body_rules(endpoint: EndpointConfig) -> bool:
    return True  # every Messages body meets its API version's rules


def body_rules(
    body: dict[str, Any], endpoint: EndpointConfig, wire: Format, sampling_rule: DropRule
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The endpoint's ``anthropic-version`` rules: what it refuses whatever is left out is
    incapable; the sampling fields it refuses are dropped or, by the config's rule, make
    the target incapable."""
    version = endpoint.anthropic_version
    why = version_incapable(body, version)
    if why:
        raise hub.Incapable(why)
    refused = refused_sampling(body, version)
    why = f"refused by anthropic-version {version.value}; [client] refused_sampling"
    dropped = hub.drop_or_refuse(refused, sampling_rule, why)
    return (without(body, dropped) if dropped else body), dropped


# ---------------------------------------------------------------- the API versions' rules

SAMPLING_PARAMS = ("temperature", "top_p", "top_k")


def refused_sampling(body: Mapping[str, Any], version: AnthropicVersion) -> tuple[str, ...]:
    """The sampling fields of ``body`` that ``version`` answers 400 to. Whether the target
    is then skipped or sent without them is the config's rule, not decided here."""
    if not version.refuses_sampling:
        return ()
    return tuple(name for name in SAMPLING_PARAMS if name in body)


def without(body: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """``body`` with ``fields`` left out (the "send without them" rule)."""
    drop = frozenset(fields)
    return {k: v for k, v in body.items() if k not in drop}


def version_incapable(body: Mapping[str, Any], version: AnthropicVersion) -> str | None:
    """Why ``version`` cannot take ``body`` whatever is left out, or None: 2026-10-21
    refuses document blocks in assistant messages and citations on user text blocks."""
    if not version.refuses_assistant_documents_and_user_citations:
        return None
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if type(block) is not dict and not isinstance(block, Mapping):  # dict first: the cheap check
                continue
            if message.get("role") == "assistant" and block.get("type") == "document":
                return f"messages[{i}]: a document block in an assistant message (refused by {version.value})"
            if message.get("role") == "user" and block.get("type") == "text" and block.get("citations"):
                return f"messages[{i}]: citations on a user text block (refused by {version.value})"
    return None
