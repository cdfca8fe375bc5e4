"""The Azure OpenAI dialect (``api = "azure"``): its v1 API (``{base_url}/openai/v1/...``,
the OpenAI dialect's paths) or, with an ``api_version`` other than "v1", the classic
deployment URL (chat completions only); the key as ``api-key``. Its own endpoint key:
``api_version``. A module of :class:`capmon.core.providers.dialect.Dialect`."""

from __future__ import annotations

from capmon.core.providers import openai_dialect
from capmon.core.providers.dialect import Auth, Headers
from capmon.core.providers.sse import SSEParser
from capmon.core.types.config import EndpointConfig, ModelConfig
from capmon.core.types.result import Format, Request

GENAI_PROVIDER = "azure.ai.openai"  # gen_ai.provider.name (OpenTelemetry's GenAI conventions)

wire_of = openai_dialect.wire_of
stream_urls = openai_dialect.stream_urls


def urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    """The classic deployment URL names the model's wire name (``api_model``, else its
    name) as the deployment and serves chat completions only."""
    base = endpoint.base_url.rstrip("/")
    if endpoint.azure_classic:
        query = "?api-version=" + endpoint.api_version
        return {Format.CHAT: f"{base}/openai/deployments/{model.wire_name}/chat/completions{query}"}
    return openai_dialect.served(base + "/openai/v1")


def unserved(endpoint: EndpointConfig, wire: Format) -> str | None:
    if endpoint.azure_classic and wire is Format.RESPONSES:
        return (
            f"Azure's deployment URL (api_version = {endpoint.api_version}) serves chat completions only; "
            'api_version = "v1" serves the Responses API'
        )
    return None


def auth(endpoint: EndpointConfig, secret: str) -> Auth:
    return Auth({"api-key": secret} if secret else {})


def caller_headers(headers: Headers, request: Request) -> Headers | None:
    return None


def framing() -> SSEParser:
    return SSEParser()


has_body_rules = openai_dialect.has_body_rules
body_rules = openai_dialect.body_rules
