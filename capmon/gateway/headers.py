"""The response headers that say who served a request: capmon's own, and LiteLLM's
names for them so tools written against LiteLLM's proxy read them unchanged."""

from __future__ import annotations

from dataclasses import dataclass

from capmon.core.result import ChatResult, Priority
from capmon.core.streaming import ChatStream


@dataclass(frozen=True, slots=True)
class Served:
    model: str
    endpoint: str
    target: str
    attempts: int  # the serving attempt included
    fallbacks: int
    request_id: int

    @staticmethod
    def of_result(r: ChatResult) -> Served:
        return Served(r.model, r.endpoint, r.target, max(1, len(r.attempts)), r.fallbacks, r.request_id)

    @staticmethod
    def of_stream(s: ChatStream) -> Served:
        """Read when the first chunk is out: ``s.attempts`` are the failed ones before it."""
        return Served(s.model or "", s.endpoint or "", s.target or "", len(s.attempts) + 1, s.fallbacks, s.request_id)

    def headers(self, priority: Priority) -> dict[str, str]:
        return {
            name: header_value(value)
            for name, value in {
                "x-capmon-model": self.model,
                "x-capmon-endpoint": self.endpoint,
                "x-capmon-target": self.target,
                "x-capmon-attempts": str(self.attempts),
                "x-capmon-fallbacks": str(self.fallbacks),
                "x-capmon-request-id": str(self.request_id),
                "x-capmon-priority": priority.value,
                "x-litellm-model-id": self.target,
                "x-litellm-attempted-fallbacks": str(self.fallbacks),
            }.items()
        }


def header_value(text: str) -> str:
    """A header value must be printable latin-1; a model named in another script still gets one."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(ch if ch.isprintable() and ord(ch) < 256 else "?" for ch in text)
