"""The response headers that say who served a request: capmon's own (the model, its
endpoint, the id that endpoint knows it by, and its API, the attempts and fallbacks, the
request's number, the sampling fields left out for a target whose API version refuses them),
and LiteLLM's names for them so tools written against LiteLLM's proxy read them unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from capmon.core.base.secrets import redact
from capmon.core.routing.streaming import ChatStream
from capmon.core.types.result import Attempt, ChatResult, Priority, sent, skipped

SKIPPED_CHARS = 1024  # x-capmon-skipped at most: a long list ends with "; +N more"
_SKIP_DETAIL_CHARS = 120


@dataclass(frozen=True, slots=True)
class Served:
    model: str
    endpoint: str
    target: str
    attempts: int  # the serving attempt included
    fallbacks: int
    request_id: int
    api: str = ""  # the endpoint API that served: openai, anthropic, azure
    dropped: tuple[str, ...] = ()  # fields left out by [client] refused_sampling = "drop"
    max_tokens: int | None = None  # the output cap sent when [client] cap_client_tokens lowered the caller's
    skipped: str | None = None  # x-capmon-skipped: the targets passed over and why
    deployment: str = ""  # the id the serving endpoint knows the model by (its deployment's)

    @staticmethod
    def of_result(r: ChatResult) -> Served:
        attempts = max(1, len(sent(r.attempts)))
        return Served(
            r.model,
            r.endpoint,
            r.target,
            attempts,
            r.fallbacks,
            r.request_id,
            r.api.value,
            r.dropped,
            r.max_tokens_lowered,
            skipped_header(r.attempts),
            r.deployment,
        )

    @staticmethod
    def of_stream(s: ChatStream) -> Served:
        """Read when the first chunk is out: ``s.attempts`` are the failed ones (and the
        skips) before it."""
        api = s.api.value if s.api is not None else ""
        attempts = len(sent(s.attempts)) + 1
        return Served(
            s.model or "",
            s.endpoint or "",
            s.target or "",
            attempts,
            s.fallbacks,
            s.request_id,
            api,
            s.dropped,
            s.max_tokens_lowered,
            skipped_header(s.attempts),
            s.deployment or "",
        )

    def headers(self, priority: Priority) -> dict[str, str]:
        """Beside these, every reply has ``x-request-id`` (capmon/gateway/exchange.py)."""
        own = {"x-capmon-dropped": ",".join(self.dropped)} if self.dropped else {}
        if self.max_tokens is not None:
            own["x-capmon-max-tokens"] = str(self.max_tokens)
        if self.skipped:
            own["x-capmon-skipped"] = self.skipped
        if self.deployment:
            own["x-capmon-deployment"] = self.deployment
        return {
            name: header_value(value)
            for name, value in {
                "x-capmon-model": self.model,
                "x-capmon-endpoint": self.endpoint,
                "x-capmon-api": self.api,
                "x-capmon-target": self.target,
                "x-capmon-attempts": str(self.attempts),
                "x-capmon-fallbacks": str(self.fallbacks),
                "x-capmon-request-id": str(self.request_id),
                "x-capmon-priority": priority.value,
                "x-litellm-model-id": self.target,
                "x-litellm-attempted-fallbacks": str(self.fallbacks),
                **own,
            }.items()
        }

    def raw(self, priority: Priority) -> list[tuple[bytes, bytes]]:
        """:meth:`headers` as an answer's start carries them: the same names and values, in
        the same order, as latin-1 bytes; the values a target repeats on every answer
        encoded once (:func:`_encoded`)."""
        fallbacks = str(self.fallbacks).encode()
        target = _encoded(self.target)
        out = [
            (b"x-capmon-model", _encoded(self.model)),
            (b"x-capmon-endpoint", _encoded(self.endpoint)),
            (b"x-capmon-api", _encoded(self.api)),
            (b"x-capmon-target", target),
            (b"x-capmon-attempts", str(self.attempts).encode()),
            (b"x-capmon-fallbacks", fallbacks),
            (b"x-capmon-request-id", str(self.request_id).encode()),
            (b"x-capmon-priority", _encoded(priority.value)),
            (b"x-litellm-model-id", target),
            (b"x-litellm-attempted-fallbacks", fallbacks),
        ]
        if self.dropped:
            out.append((b"x-capmon-dropped", header_value(",".join(self.dropped)).encode("latin-1")))
        if self.max_tokens is not None:
            out.append((b"x-capmon-max-tokens", str(self.max_tokens).encode()))
        if self.skipped:
            out.append((b"x-capmon-skipped", header_value(self.skipped).encode("latin-1")))
        if self.deployment:
            out.append((b"x-capmon-deployment", _encoded(self.deployment)))
        return out


_ENCODED: dict[str, bytes] = {}
_ENCODED_MAX = 4096  # names from the config, a few per target: past it the cache starts again


def _encoded(text: str) -> bytes:
    """``header_value(text)`` as latin-1 bytes, worked out once per name."""
    value = _ENCODED.get(text)
    if value is None:
        if len(_ENCODED) >= _ENCODED_MAX:
            _ENCODED.clear()
        value = _ENCODED[text] = header_value(text).encode("latin-1")
    return value


def header_value(text: str) -> str:
    """A header value must be printable latin-1; a model named in another script still gets one."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(ch if ch.isprintable() and ord(ch) < 256 else "?" for ch in text)


def skipped_header(attempts: Sequence[Attempt]) -> str | None:
    """``x-capmon-skipped``: each target passed over as ``target=why (detail)``, joined by
    "; ", at most SKIPPED_CHARS long (the rest counted as "+N more"); None when none was."""
    entries = []
    for a in skipped(attempts):
        detail = a.reason.removeprefix(f"{a.skip}: ") if a.skip else a.reason
        detail = redact(detail, hints=False).replace(";", ",")  # a client of the gateway sees no part of a key
        if len(detail) > _SKIP_DETAIL_CHARS:
            detail = detail[: _SKIP_DETAIL_CHARS - 3] + "..."
        entries.append(f"{a.target}={a.skip or 'skip'} ({detail})")
    if not entries:
        return None
    out = ""
    for i, entry in enumerate(entries):
        more = f"; +{len(entries) - i} more"
        piece = entry if not out else f"; {entry}"
        if len(out) + len(piece) + (len(more) if i + 1 < len(entries) else 0) > SKIPPED_CHARS:
            return header_value(out + (more if out else f"+{len(entries)} skipped"))
        out += piece
    return header_value(out)
