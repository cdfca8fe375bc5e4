"""Server-side fault switches, for testing how a client survives a broken provider.

Rules are set through ``POST /admin/faults`` and apply to chat requests that passed
auth and validation, before the capacity check: a faulted request takes no slot, so a
test that injects faults still knows exactly how much capacity is left.

Pure: the rules and a raw-ASGI response that drops the connection; no web framework.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, MutableMapping

# Long enough to outlast any client timeout; on a fast-forwarded clock it costs nothing.
HANG_SECONDS = 24 * 3600.0

HTML_500_PAGE = (
    "<html>\r\n<head><title>500 Internal Server Error</title></head>\r\n<body>\r\n"
    "<center><h1>500 Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n"
    "</body>\r\n</html>\r\n"
)


class FaultMode(str, enum.Enum):
    RESET = "reset"  # the connection drops mid-response
    TRUNCATE = "truncate"  # 200 with half a JSON body
    HANG = "hang"  # never answers
    INVALID_JSON = "invalid_json"  # 200 with `not json`
    HTML_500 = "html_500"  # an HTML error page from a proxy
    STREAM_CUT = "stream_cut"  # a stream stops halfway, no [DONE]; streaming requests only


@dataclass(frozen=True)
class FaultRule:
    """Apply ``mode`` to the next ``count`` requests, or to each with probability ``rate``;
    to one model only when ``model`` is set."""

    mode: FaultMode
    count: int | None = None
    rate: float | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.rate is None):
            raise ValueError("a fault rule needs exactly one of count or rate")
        if self.count is not None and self.count < 1:
            raise ValueError(f"count must be at least 1, got {self.count}")
        if self.rate is not None and not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1, got {self.rate}")

    def applies_to(self, model: str, stream: bool) -> bool:
        if self.model is not None and self.model != model:
            return False
        # A cut stream needs a stream; plain requests pass by and do not use up the count.
        return stream or self.mode is not FaultMode.STREAM_CUT


def parse_rules(raw: Any) -> tuple[FaultRule, ...]:
    """``{"mode": "reset", "count": 2}``, a list of those, or ``{"mode": "off"}`` (no rules).
    Raises ValueError with a message fit for a 400 answer."""
    items = raw if isinstance(raw, list) else [raw]
    rules: list[FaultRule] = []
    modes = ", ".join(m.value for m in FaultMode)
    for item in items:
        if not isinstance(item, dict):
            raise ValueError('expected {"mode": ..., "count": N} or {"mode": ..., "rate": p}')
        unknown = set(item) - {"mode", "count", "rate", "model"}
        if unknown:
            raise ValueError(f"unknown fault field(s): {', '.join(sorted(unknown))}")
        mode = item.get("mode")
        if mode in ("off", "none"):
            continue
        try:
            fault = FaultMode(mode)
        except ValueError:
            raise ValueError(f"unknown fault mode {mode!r}; expected one of {modes}, or off") from None
        count, rate, model = item.get("count"), item.get("rate"), item.get("model")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise ValueError(f"count must be a whole number, got {count!r}")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))):
            raise ValueError(f"rate must be a number, got {rate!r}")
        if model is not None and not isinstance(model, str):
            raise ValueError(f"model must be a string, got {model!r}")
        if count is None and rate is None:
            count = 1
        rules.append(FaultRule(fault, count, None if rate is None else float(rate), model))
    return tuple(rules)


class FaultInjector:
    """The active rules; the first that applies to a request wins."""

    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._left: list[int | None] = []

    def set(self, rules: tuple[FaultRule, ...]) -> None:
        """Replace the active rules (an empty tuple switches faults off)."""
        self._rules = list(rules)
        self._left = [r.count for r in rules]

    def clear(self) -> None:
        self.set(())

    def take(self, model: str, stream: bool, rng: random.Random) -> FaultMode | None:
        for i, rule in enumerate(self._rules):
            if not rule.applies_to(model, stream):
                continue
            left = self._left[i]
            if left is not None:
                if left == 1:
                    del self._rules[i], self._left[i]
                else:
                    self._left[i] = left - 1
                return rule.mode
            if rng.random() < (rule.rate or 0.0):
                return rule.mode
        return None

    def snapshot(self) -> list[dict[str, Any]]:
        return [{"mode": r.mode.value, "count": left, "rate": r.rate, "model": r.model}
                for r, left in zip(self._rules, self._left)]


class ConnectionDropped(Exception):
    """Raised inside the ASGI app after the response has started, so the server closes the
    connection with the body unfinished: the client sees a dropped connection."""


Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class DropConnection:
    """A raw ASGI response: promise a body, send a few bytes of it, then drop the connection."""

    async def __call__(self, scope: Any, receive: Any, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")]})
        await send({"type": "http.response.body", "body": b'{"id": "chatcmpl-', "more_body": True})
        raise ConnectionDropped("simulated connection reset")
