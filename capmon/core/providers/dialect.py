"""An endpoint's dialect: what talking to one provider API (``[[endpoints]] api``,
:class:`~capmon.core.types.config.EndpointApi`) takes besides the format of the bodies it
carries: which format an attempt speaks there (which may depend on the model: Vertex AI
serves Google's models in Gemini's format and Anthropic's in Messages), its URLs (a
streamed attempt's may differ: Google's ``:streamGenerateContent``), how a key
authenticates each request, and how its stream is framed. A format (capmon/core/providers/*_format.py, the
registry ``hub.FORMATS``) says what a body, an answer and a frame mean; a dialect says where
they go and how they travel. formats.py composes the two. A new endpoint kind is one
module and one line in :data:`DIALECTS` (its own endpoint keys, if any: a field of
``EndpointConfig`` and a line of ``config.ENDPOINT_SETTINGS``, which the config checks).

**Auth.** :class:`Auth` is what a target's key puts on its requests, in two parts, the
way ``httpx.Auth.auth_flow`` sees a request but split by cost:

* ``headers``: the fixed headers a static key sends on every request (``Authorization:
  Bearer``, ``x-api-key`` with ``anthropic-version``, Azure's ``api-key``). The target
  encodes them once into its ready header block (``transport.Head``), so a static key
  costs nothing per request;
* ``sign``: called with every request an attempt builds, a user's or the prober's
  (``attempt._sent``), once its body bytes are final (``request.content``), before it is
  sent; it may add or replace headers. ``None`` for a static key: then nothing is called
  at all, not even a no-op. It is a coroutine function because a refreshed token may have
  to be fetched (an OAuth token endpoint, a cloud's metadata service); a signature that
  is pure CPU (AWS SigV4 over the method, URL, headers and body hash) is an ``async def``
  that never awaits. Its time counts against the attempt's timeout.

**Framing.** :func:`Dialect.framing` makes the reader that turns a stream's bytes into
:class:`~capmon.core.providers.sse.Frame` s (server-sent events, ``sse.SSEParser``, and
Google's, ``google_sse.GoogleFraming``; AWS's binary event stream,
``aws_eventstream.EventStreamFraming``: one frame per message, its ``:event-type`` header as
``Frame.event`` and its payload as ``Frame.data``).
What a frame means is the format's (``read_frame`` of each format module).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from capmon.core.providers.sse import Frame
from capmon.core.types.config import DropRule, EndpointApi, EndpointConfig, ModelConfig
from capmon.core.types.result import Format, Request

Headers = list[tuple[bytes, bytes]]  # a target's encoded headers (``Sender.headers``)
Sign = Callable[[httpx.Request], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Auth:
    """What a key puts on every request to its endpoint: fixed headers, and a hook per
    request (None: there is none; see the module's docstring)."""

    headers: Mapping[str, str] = field(default_factory=dict)
    sign: Sign | None = None


class FrameReader(Protocol):
    """A stream's bytes in, frames out (``sse.SSEParser`` is one)."""

    def feed(self, chunk: bytes) -> list[Frame]: ...

    def close(self) -> list[Frame]:
        """The frames still held when the body ends."""
        ...


class Dialect(Protocol):
    """What a dialect module provides (the module itself is the implementation)."""

    # The API's name in OpenTelemetry's GenAI conventions (``gen_ai.provider.name``: the
    # gateway's spans say it).
    GENAI_PROVIDER: str

    def wire_of(self, caller: Format, model: str) -> Format:
        """The format an attempt for a ``caller`` request to ``model`` (its name at the
        endpoint, ``ModelConfig.wire_name``) speaks to an endpoint of this API."""
        ...

    def urls(self, endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
        """The URL of each wire the endpoint serves (for ``model``)."""
        ...

    def stream_urls(self, endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
        """The URL of each wire whose streamed attempts go elsewhere than :func:`urls`
        says (Google's ``:streamGenerateContent?alt=sse``); a wire not here streams at its
        plain URL, the body alone saying it streams."""
        ...

    def unserved(self, endpoint: EndpointConfig, wire: Format) -> str | None:
        """Why ``endpoint`` cannot take a ``wire`` request it would otherwise speak, or None."""
        ...

    def auth(self, endpoint: EndpointConfig, secret: str) -> Auth:
        """What the key ``secret`` ("" for an endpoint without keys) puts on each request."""
        ...

    def caller_headers(self, headers: Headers, request: Request) -> Headers | None:
        """The target's ``headers`` with what the caller's own request adds (Anthropic's
        betas), or None when it adds nothing (the target's ready block is sent)."""
        ...

    def framing(self) -> FrameReader:
        """A new reader of one stream's frames."""
        ...

    def has_body_rules(self, endpoint: EndpointConfig) -> bool:
        """Whether :func:`body_rules` may refuse or change a body (when not, a request in the
        wire's own format needs no check before it is sent: it passes untouched)."""
        ...

    def body_rules(
        self, body: dict[str, Any], endpoint: EndpointConfig, wire: Format, sampling_rule: DropRule
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """``body`` (in ``wire``) as the endpoint takes it, and the fields left out
        (``sampling_rule``: the config's rule for sampling fields an API version refuses). Raises
        :class:`~capmon.core.providers.hub.Incapable` for what it refuses whatever is left out."""
        ...


def dialect_of(endpoint: EndpointConfig) -> Dialect:
    """The dialect of ``endpoint``'s API."""
    return DIALECTS[endpoint.api]


# The registry, below the protocol its modules import this module for.
from capmon.core.providers import (  # noqa: E402
    anthropic_dialect,
    azure_dialect,
    bedrock_dialect,
    gemini_dialect,
    openai_dialect,
    vertex_dialect,
)

DIALECTS: dict[EndpointApi, Dialect] = {
    EndpointApi.OPENAI: openai_dialect,
    EndpointApi.AZURE: azure_dialect,
    EndpointApi.ANTHROPIC: anthropic_dialect,
    EndpointApi.GEMINI: gemini_dialect,
    EndpointApi.VERTEX: vertex_dialect,
    EndpointApi.BEDROCK: bedrock_dialect,
}
