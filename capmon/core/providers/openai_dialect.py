"""The OpenAI dialect (``api = "openai"``): ``{base_url}/chat/completions`` and
``/responses``, the key as ``Authorization: Bearer``, server-sent events. Every
OpenAI-compatible server (vLLM, Ollama, OpenRouter, Together...) speaks it. A module of
:class:`capmon.core.providers.dialect.Dialect`."""

from __future__ import annotations

from typing import Any

from capmon.core.providers.dialect import Auth, Headers
from capmon.core.providers.sse import SSEParser
from capmon.core.types.config import DropRule, EndpointConfig, ModelConfig
from capmon.core.types.result import Format, Request

GENAI_PROVIDER = "openai"  # gen_ai.provider.name (OpenTelemetry's GenAI conventions)


_OWN = frozenset({Format.CHAT, Format.RESPONSES})


def wire_of(caller: Format, model: str) -> Format:
    """The caller's format when it is OpenAI's (chat completions, the Responses API), else
    chat completions (an OpenAI-wire endpoint speaks neither Messages nor Gemini's)."""
    return caller if caller in _OWN else Format.CHAT


def urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    return served(endpoint.base_url.rstrip("/"))


def served(base: str) -> dict[Format, str]:
    """The chat completions and Responses URLs under ``base``."""
    return {Format.CHAT: base + "/chat/completions", Format.RESPONSES: base + "/responses"}


def stream_urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    return {}  # the body's ``stream: true`` says it


def unserved(endpoint: EndpointConfig, wire: Format) -> str | None:
    return None


def auth(endpoint: EndpointConfig, secret: str) -> Auth:
    """``Authorization: Bearer``; no key header at all for a server that takes no key (``keys = []``)."""
    return Auth({"authorization": f"Bearer {secret}"} if secret else {})


def caller_headers(headers: Headers, request: Request) -> Headers | None:
    return None


def framing() -> SSEParser:
    return SSEParser()


def has_body_rules(endpoint: EndpointConfig) -> bool:
    return False


def body_rules(
    body: dict[str, Any], endpoint: EndpointConfig, wire: Format, sampling_rule: DropRule
) -> tuple[dict[str, Any], tuple[str, ...]]:
    return body, ()
