"""The Gemini API dialect (``api = "gemini"``, Google AI Studio's keys):
``{base_url}/v1beta/models/{model}:generateContent`` and, streamed,
``:streamGenerateContent?alt=sse``, which speak Gemini's format whatever the caller's; the
key as ``x-goog-api-key`` (never ``?key=`` in the URL, which logs and error texts would
show); Google's server-sent events (google_sse.py). A module of
:class:`capmon.core.providers.dialect.Dialect`."""

from __future__ import annotations

import urllib.parse

from capmon.core.providers import openai_dialect
from capmon.core.providers.dialect import Auth
from capmon.core.providers.google_sse import GoogleFraming
from capmon.core.types.config import EndpointConfig, ModelConfig
from capmon.core.types.result import Format

API_PATH = "/v1beta"
GENAI_PROVIDER = "gcp.gemini"  # gen_ai.provider.name (OpenTelemetry's GenAI conventions)


def wire_of(caller: Format, model: str) -> Format:
    return Format.GEMINI


def urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    return {Format.GEMINI: generate(model_url(endpoint, model))}


def stream_urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    return {Format.GEMINI: stream_generate(model_url(endpoint, model))}


def model_url(endpoint: EndpointConfig, model: ModelConfig) -> str:
    """The model's resource: ``models/{name}``, or the name as written when it names a
    resource of its own (``tunedModels/...``, or ``models/...`` as google-genai takes it)."""
    name = model.wire_name
    return endpoint.base_url.rstrip("/") + API_PATH + "/" + segment(name if "/" in name else "models/" + name)


def segment(path: str) -> str:
    """``path`` escaped for a URL's path (a model id's ``@`` and ``/`` kept: Vertex's
    ``claude-sonnet-4-5@20250929``)."""
    return urllib.parse.quote(path, safe="/@")


def generate(model: str) -> str:
    """A Gemini model's (``model``: its resource's URL) plain answer."""
    return model + ":generateContent"


def stream_generate(model: str) -> str:
    """A Gemini model's stream, as server-sent events (without ``alt=sse``, a JSON array)."""
    return model + ":streamGenerateContent?alt=sse"


unserved = openai_dialect.unserved


def auth(endpoint: EndpointConfig, secret: str) -> Auth:
    return Auth({"x-goog-api-key": secret} if secret else {})


def framing() -> GoogleFraming:
    return GoogleFraming()


caller_headers = openai_dialect.caller_headers  # a caller's headers add nothing here either
has_body_rules = openai_dialect.has_body_rules
body_rules = openai_dialect.body_rules
