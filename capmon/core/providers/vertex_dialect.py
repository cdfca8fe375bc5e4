"""The Vertex AI dialect (``api = "vertex"``): a project's and region's publisher models
under ``{base_url}/v1/projects/{project}/locations/{region}/publishers/``, its own endpoint
keys ``project``, ``region`` and ``credentials_file``.

* Google's models (``publishers/google``) speak Gemini's format, at ``:generateContent``
  and, streamed, ``:streamGenerateContent?alt=sse``, as the Gemini API does;
* Anthropic's (``publishers/anthropic``) speak Messages at ``:rawPredict`` and, streamed,
  ``:streamRawPredict``: the model is in the URL, not the body, whose
  ``anthropic_version`` is Vertex's own (:func:`body_rules`).

Which publisher serves a model is told by its id, as Vertex's Model Garden names them:
Anthropic's are ``claude-*`` (``claude-sonnet-4-5@20250929``), Google's never are. No
setting overrides it: no other publisher is spoken here, and a model a rule misplaced would
answer 404 at its first request, not quietly in the wrong format.

The key: a token in ``keys`` (an environment variable: ``gcloud auth print-access-token``
for a test or a short job) is sent as a fixed ``Authorization: Bearer``; an endpoint
without keys gets Google OAuth tokens from its credentials, refreshed before they expire
(google_token.py: the ``google`` extra). Google's server-sent events (google_sse.py) for
both publishers: Vertex's front end answers errors in Google's shape before either model's
stream begins. A module of :class:`capmon.core.providers.dialect.Dialect`.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

from capmon.core.providers import gemini_dialect, google_token, openai_dialect
from capmon.core.providers.dialect import Auth
from capmon.core.types.config import DropRule, EndpointConfig, ModelConfig
from capmon.core.types.result import Format

GENAI_PROVIDER = "gcp.vertex_ai"  # gen_ai.provider.name (OpenTelemetry's GenAI conventions)
# The body's anthropic_version Vertex takes for Claude (no anthropic-version header there).
ANTHROPIC_VERSION = "vertex-2023-10-16"


class Publisher(enum.StrEnum):
    """Whose model it is on Vertex AI (``publishers/{publisher}`` in its URL)."""

    GOOGLE = "google"
    ANTHROPIC = "anthropic"


def publisher(model: str) -> Publisher:
    """Who publishes ``model`` (its id at Vertex): Anthropic's ids are ``claude-*``."""
    return Publisher.ANTHROPIC if model.startswith("claude-") else Publisher.GOOGLE


def wire_of(caller: Format, model: str) -> Format:
    return Format.MESSAGES if publisher(model) is Publisher.ANTHROPIC else Format.GEMINI


def model_url(endpoint: EndpointConfig, model: ModelConfig) -> str:
    """The model's resource under its endpoint's project and region."""
    name = model.wire_name
    path = f"/v1/projects/{endpoint.project}/locations/{endpoint.region}/publishers/{publisher(name)}/models/{name}"
    return endpoint.base_url.rstrip("/") + gemini_dialect.segment(path)


def urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    url = model_url(endpoint, model)
    if publisher(model.wire_name) is Publisher.ANTHROPIC:
        return {Format.MESSAGES: url + ":rawPredict"}
    return {Format.GEMINI: gemini_dialect.generate(url)}


def stream_urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    url = model_url(endpoint, model)
    if publisher(model.wire_name) is Publisher.ANTHROPIC:
        return {Format.MESSAGES: url + ":streamRawPredict"}
    return {Format.GEMINI: gemini_dialect.stream_generate(url)}


unserved = openai_dialect.unserved


def auth(endpoint: EndpointConfig, secret: str) -> Auth:
    """The token in ``keys`` as a fixed bearer; without keys, the endpoint's Google
    credentials' tokens, per request (one source per target: google_token.py)."""
    if secret:
        return Auth({"authorization": f"Bearer {secret}"})
    what = f'endpoint "{endpoint.name}" (api = "vertex", keys = [])'
    google_token.require_google(what)  # at start, not at the first request
    source = google_token.TokenSource(functools.partial(google_token.load, endpoint.credentials_file), what)
    return Auth({}, source.sign)


caller_headers = openai_dialect.caller_headers  # a caller's headers add nothing here
framing = gemini_dialect.framing  # Google's SSE for both publishers


def has_body_rules(endpoint: EndpointConfig) -> bool:
    return True  # Claude's body: its model moves to the URL, Vertex's anthropic_version in


def body_rules(
    body: dict[str, Any], endpoint: EndpointConfig, wire: Format, sampling_rule: DropRule
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A Messages body (Claude's) without ``model`` (the URL names it) and with Vertex's
    ``anthropic_version``; Gemini's body as its format made it."""
    if wire is not Format.MESSAGES:
        return body, ()
    return {"anthropic_version": ANTHROPIC_VERSION, **{k: v for k, v in body.items() if k != "model"}}, ()
