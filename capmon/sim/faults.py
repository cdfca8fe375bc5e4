"""Server-side fault switches, for testing how a client survives a broken provider.

Rules are set through ``POST /admin/faults`` and apply to chat requests that passed
auth and validation, before the capacity check: a faulted request takes no slot, so a
test that injects faults still knows exactly how much capacity is left.

A rule applies to chat completions, the Responses API and Anthropic's Messages API alike,
except where its mode says otherwise: ``stream_cut`` needs a stream; ``stream_error`` needs
a stream of the API its ``dialect`` speaks; ``huge`` answers chat completions only;
``error`` answers ``status`` in the shape of the wire the request came in on;
``broken_tool_args`` needs a request that may call one of its tools; ``stall`` needs a
stream. ``hang`` accepts the request and never sends a header (a silent route);
``slow_first_token`` sends the headers (and a stream's opening frames) at once and the
first token ``seconds`` later; ``stall`` streams ``tokens`` tokens of output, then nothing
for ``seconds``, then the rest of the answer.

Pure: the rules and a raw-ASGI response that drops the connection; no web framework.
"""

from __future__ import annotations

import enum
import random
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from capmon.core.base.clock import Clock
from capmon.sim.dialects import OPENROUTER_STREAM, STATUS_ERRORS, STREAM_DIALECTS, Api, speaks

# Long enough to outlast any client timeout; on a fast-forwarded clock it costs nothing.
HANG_SECONDS = 24 * 3600.0
# A huge body is generated, never held, so this only keeps the number finite (1 TiB).
MAX_HUGE_BYTES = 1 << 40

HTML_500_PAGE = (
    "<html>\r\n<head><title>500 Internal Server Error</title></head>\r\n<body>\r\n"
    "<center><h1>500 Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n"
    "</body>\r\n</html>\r\n"
)


class FaultMode(str, enum.Enum):
    RESET = "reset"  # the connection drops mid-response
    TRUNCATE = "truncate"  # 200 with half a JSON body
    HANG = "hang"  # never answers: not even the response headers
    INVALID_JSON = "invalid_json"  # 200 with `not json`
    HTML_500 = "html_500"  # an HTML error page from a proxy
    STREAM_CUT = "stream_cut"  # a stream stops halfway (or after `after` content chunks), no [DONE]; streams only
    STREAM_ERROR = "stream_error"  # `after` content chunks, then `dialect`'s in-stream error frame
    HUGE = "huge"  # 200 with a generated body of `bytes` bytes: a real completion (`valid`) or not JSON
    ERROR = "error"  # an HTTP error of `status` (401, 403, 500...) in the wire's own shape
    # A call of the request's tool, plain or streamed, with its arguments cut halfway (not JSON)
    # and the answer otherwise whole (finish reason, [DONE], message_stop, response.completed).
    BROKEN_TOOL_ARGS = "broken_tool_args"
    SLOW_FIRST_TOKEN = "slow_first_token"  # headers at once, the first token after `seconds`
    STALL = "stall"  # a stream: `tokens` tokens, then silence for `seconds`, then the rest; streams only


# Modes answered with a broken stream (a stream request's only); modes whose stream is the
# whole answer at another pace (a plain request gets its answer late, or whole).
STREAMED = (FaultMode.STREAM_CUT, FaultMode.STREAM_ERROR)
PACED = (FaultMode.SLOW_FIRST_TOKEN, FaultMode.STALL)


@dataclass(frozen=True)
class FaultRule:
    """Apply ``mode`` to the next ``count`` requests, or to each with probability ``rate``;
    to one model only when ``model`` is set. ``after`` and ``dialect`` shape a stream_error,
    ``bytes`` and ``valid`` a huge body, ``status`` an error, ``seconds`` a slow first token
    or a stall, ``tokens`` where a stall begins."""

    mode: FaultMode
    count: int | None = None
    rate: float | None = None
    model: str | None = None
    after: int = 0
    dialect: str = OPENROUTER_STREAM
    bytes: int = 0
    valid: bool = True
    status: int = 500
    seconds: float = 0.0
    tokens: int = 0

    def __post_init__(self) -> None:
        if (self.count is None) == (self.rate is None):
            raise ValueError("a fault rule needs exactly one of count or rate")
        if self.count is not None and self.count < 1:
            raise ValueError(f"count must be at least 1, got {self.count}")
        if self.rate is not None and not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1, got {self.rate}")
        if self.after < 0:
            raise ValueError(f"after must be a whole number >= 0, got {self.after}")
        if self.dialect not in STREAM_DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(STREAM_DIALECTS)}, got {self.dialect!r}")
        if self.mode is FaultMode.ERROR and self.status not in STATUS_ERRORS:
            raise ValueError(f"status must be one of {', '.join(map(str, STATUS_ERRORS))}, got {self.status}")
        if not 0.0 <= self.seconds <= HANG_SECONDS:
            raise ValueError(f"seconds must be from 0 to {HANG_SECONDS:g}, got {self.seconds!r}")
        if self.tokens < 0:
            raise ValueError(f"tokens must be a whole number >= 0, got {self.tokens}")
        if self.mode is FaultMode.HUGE and not 1 <= self.bytes <= MAX_HUGE_BYTES:
            raise ValueError(f"bytes must be a whole number from 1 to {MAX_HUGE_BYTES}, got {self.bytes}")

    def applies_to(self, model: str, stream: bool, api: Api = Api.CHAT, tools: bool = False) -> bool:
        """``tools``: the request may call one of its tools."""
        if self.model is not None and self.model != model:
            return False
        # Requests a rule cannot shape pass by and do not use up its count.
        if self.mode in (FaultMode.STREAM_CUT, FaultMode.STALL):
            return stream
        if self.mode is FaultMode.STREAM_ERROR:
            return stream and speaks(self.dialect, api)
        if self.mode is FaultMode.HUGE:
            return api is Api.CHAT
        if self.mode is FaultMode.BROKEN_TOOL_ARGS:
            return tools
        return True

    def as_json(self, left: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode.value, "count": left, "rate": self.rate, "model": self.model}
        if self.mode is FaultMode.STREAM_ERROR:
            out.update(after=self.after, dialect=self.dialect)
        elif self.mode is FaultMode.STREAM_CUT and self.after:
            out.update(after=self.after)
        elif self.mode is FaultMode.HUGE:
            out.update(bytes=self.bytes, valid=self.valid)
        elif self.mode is FaultMode.ERROR:
            out.update(status=self.status)
        elif self.mode is FaultMode.SLOW_FIRST_TOKEN:
            out.update(seconds=self.seconds)
        elif self.mode is FaultMode.STALL:
            out.update(tokens=self.tokens, seconds=self.seconds)
        return out

    def clock(self, clock: Clock) -> Clock:
        """The clock a faulted answer is timed by: ``clock``, but for a slow first token or a stall."""
        if self.mode is FaultMode.SLOW_FIRST_TOKEN:
            return FaultClock(clock, first=self.seconds)
        if self.mode is FaultMode.STALL:
            from capmon.sim.streams import STREAM_CHUNK_TOKENS  # streams imports this module's importers

            return FaultClock(clock, stall_at=-(-self.tokens // STREAM_CHUNK_TOKENS), stall=self.seconds)
        return clock


class FaultClock:
    """A clock for one answer's generator, whose sleeps are its pacing: the first is the
    wait for the first token, each later one comes before a piece of output (of
    ``STREAM_CHUNK_TOKENS`` tokens, or a piece of a tool call's arguments). ``first``
    replaces the first; the sleep before piece number ``stall_at`` (0-based) gets ``stall``
    seconds more."""

    def __init__(self, clock: Clock, *, first: float | None = None, stall_at: int = -1, stall: float = 0.0) -> None:
        self._clock = clock
        self._first = first
        self._stall_at = stall_at
        self._stall = stall
        self._sleeps = 0

    def now(self) -> float:
        return self._clock.now()

    def wall(self) -> float:
        return self._clock.wall()

    async def sleep(self, seconds: float) -> None:
        n = self._sleeps
        self._sleeps += 1
        if n == 0 and self._first is not None:
            seconds = self._first
        elif n - 1 == self._stall_at:
            seconds += self._stall
        await self._clock.sleep(seconds)


# The fields only some modes take.
_MODE_FIELDS: dict[str, tuple[FaultMode, ...]] = {
    "after": (FaultMode.STREAM_ERROR, FaultMode.STREAM_CUT),
    "dialect": (FaultMode.STREAM_ERROR,),
    "bytes": (FaultMode.HUGE,),
    "valid": (FaultMode.HUGE,),
    "status": (FaultMode.ERROR,),
    "seconds": (FaultMode.SLOW_FIRST_TOKEN, FaultMode.STALL),
    "tokens": (FaultMode.STALL,),
}


def _whole(item: dict[str, Any], name: str) -> int | None:
    value = item.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return value


def parse_rules(raw: Any) -> tuple[FaultRule, ...]:
    """``{"mode": "reset", "count": 2}``, a list of those, or ``{"mode": "off"}`` (no rules).
    Raises ValueError with a message fit for a 400 answer."""
    items = raw if isinstance(raw, list) else [raw]
    rules: list[FaultRule] = []
    modes = ", ".join(m.value for m in FaultMode)
    for item in items:
        if not isinstance(item, dict):
            raise ValueError('expected {"mode": ..., "count": N} or {"mode": ..., "rate": p}')
        unknown = set(item) - {"mode", "count", "rate", "model", *_MODE_FIELDS}
        if unknown:
            raise ValueError(f"unknown fault field(s): {', '.join(sorted(unknown))}")
        mode = item.get("mode")
        if mode in ("off", "none"):
            continue
        try:
            fault = FaultMode(mode)
        except ValueError:
            raise ValueError(f"unknown fault mode {mode!r}; expected one of {modes}, or off") from None
        for name, owners in _MODE_FIELDS.items():
            if name in item and fault not in owners:
                names = " or ".join(repr(o.value) for o in owners)
                raise ValueError(f"{name!r} applies only to mode {names}")
        count, after, size = _whole(item, "count"), _whole(item, "after"), _whole(item, "bytes")
        status = _whole(item, "status")
        rate, model, dialect, valid = item.get("rate"), item.get("model"), item.get("dialect"), item.get("valid")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))):
            raise ValueError(f"rate must be a number, got {rate!r}")
        if model is not None and not isinstance(model, str):
            raise ValueError(f"model must be a string, got {model!r}")
        if valid is not None and not isinstance(valid, bool):
            raise ValueError(f"valid must be true or false, got {valid!r}")
        if fault is FaultMode.HUGE and size is None:
            raise ValueError('a huge fault needs "bytes": N')
        seconds, tokens = item.get("seconds"), _whole(item, "tokens")
        if fault in (FaultMode.SLOW_FIRST_TOKEN, FaultMode.STALL) and seconds is None:
            raise ValueError(f'a {fault.value} fault needs "seconds": N')
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
            raise ValueError(f"seconds must be a number, got {seconds!r}")
        if count is None and rate is None:
            count = 1
        rules.append(
            FaultRule(
                fault,
                count,
                None if rate is None else float(rate),
                model,
                after=after or 0,
                dialect=OPENROUTER_STREAM if dialect is None else dialect,
                bytes=size or 0,
                valid=True if valid is None else valid,
                status=500 if status is None else status,
                seconds=0.0 if seconds is None else float(seconds),
                tokens=tokens or 0,
            )
        )
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

    def take_rule(
        self, model: str, stream: bool, rng: random.Random, api: Api = Api.CHAT, tools: bool = False
    ) -> FaultRule | None:
        """The rule that applies to this request (using up one of its count), or None."""
        for i, rule in enumerate(self._rules):
            if not rule.applies_to(model, stream, api, tools):
                continue
            left = self._left[i]
            if left is not None:
                if left == 1:
                    del self._rules[i], self._left[i]
                else:
                    self._left[i] = left - 1
                return rule
            if rng.random() < (rule.rate or 0.0):
                return rule
        return None

    def take(self, model: str, stream: bool, rng: random.Random, api: Api = Api.CHAT) -> FaultMode | None:
        rule = self.take_rule(model, stream, rng, api)
        return None if rule is None else rule.mode

    def snapshot(self) -> list[dict[str, Any]]:
        return [r.as_json(left) for r, left in zip(self._rules, self._left, strict=False)]


class ConnectionDropped(Exception):
    """Raised inside the ASGI app after the response has started, so the server closes the
    connection with the body unfinished: the client sees a dropped connection."""


Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class DropConnection:
    """A raw ASGI response: promise a body, send a few bytes of it, then drop the connection."""

    async def __call__(self, scope: Any, receive: Any, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"id": "chatcmpl-', "more_body": True})
        raise ConnectionDropped("simulated connection reset")


async def delayed(clock: Clock, seconds: float, body: bytes) -> AsyncIterator[bytes]:
    """A plain answer's body ``seconds`` after its headers (a slow first token, not streamed)."""
    await clock.sleep(seconds)
    yield body
