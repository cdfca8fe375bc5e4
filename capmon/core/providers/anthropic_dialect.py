"""The Anthropic dialect (``api = "anthropic"``): ``{base_url}/v1/messages``, which speaks
Messages whatever the caller's format; the key as ``x-api-key`` with ``anthropic-version``
(its own endpoint key); a Messages caller's ``anthropic-beta`` added to the endpoint's;
server-sent events. A module of :class:`capmon.core.providers.dialect.Dialect`."""

from __future__ import annotations

from typing import Any

from capmon.core.providers import anthropic_wire as aw
from capmon.core.providers import hub
from capmon.core.providers.dialect import Auth, Headers
from capmon.core.providers.sse import SSEParser
from capmon.core.types.config import DropRule, EndpointConfig, ModelConfig
from capmon.core.types.result import Format, Request


def wire_of(caller: Format) -> Format:
    return Format.MESSAGES


def urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    return {Format.MESSAGES: endpoint.base_url.rstrip("/") + aw.MESSAGES_PATH}


def unserved(endpoint: EndpointConfig, wire: Format) -> str | None:
    return None


def auth(endpoint: EndpointConfig, secret: str) -> Auth:
    """``x-api-key``, which every version and every compatible server takes (see
    :func:`capmon.core.providers.anthropic_wire.request_headers`), and the endpoint's
    ``anthropic-version``; no key header for a server that takes no key."""
    headers = aw.request_headers(secret, endpoint.anthropic_version)
    return Auth(headers if secret else {k: v for k, v in headers.items() if k != "x-api-key"})


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
    body: dict[str, Any], endpoint: EndpointConfig, refused_sampling: DropRule
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The endpoint's ``anthropic-version`` rules: what it refuses whatever is left out is
    incapable; the sampling fields it refuses are dropped or, by the config's rule, make
    the target incapable."""
    version = endpoint.anthropic_version
    why = aw.version_incapable(body, version)
    if why:
        raise hub.Incapable(why)
    refused = aw.refused_sampling(body, version)
    why = f"refused by anthropic-version {version.value}; [client] refused_sampling"
    dropped = hub.drop_or_refuse(refused, refused_sampling, why)
    return (aw.without(body, dropped) if dropped else body), dropped
