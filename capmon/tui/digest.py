"""Turn a burst of bus events into a few log lines and toasts.

The bus can carry thousands of events a second under load; the log must stay
readable and cheap. Only the events people act on are kept (breaker moves,
fallbacks, key parking, pins, notices); fallbacks are coalesced per second and
model pair; each digest writes at most ``max_lines`` lines and says how many it
left out; toasts are throttled per target.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text

from capmon.core import events as ev
from capmon.tui import format as fmt

LOGGED: tuple[type[ev.Event], ...] = (ev.BreakerChanged, ev.FellBack, ev.KeyParked, ev.ModelPinned, ev.Notice)


@dataclass(frozen=True)
class Toast:
    message: str
    severity: str  # information | warning | error
    title: str = ""


@dataclass
class Digest:
    lines: list[tuple[float, Text]] = field(default_factory=list)  # (wall time, line)
    toasts: list[Toast] = field(default_factory=list)
    left_out: int = 0


class EventDigester:
    def __init__(self, *, max_lines: int = 30, max_toasts: int = 3, toast_every: float = 10.0) -> None:
        self.max_lines = max_lines
        self.max_toasts = max_toasts
        self.toast_every = toast_every  # seconds between two toasts about the same target
        self._last_toast: dict[str, float] = {}

    @staticmethod
    def wants(event: ev.Event) -> bool:
        return isinstance(event, LOGGED)

    def digest(self, events: list[ev.Event]) -> Digest:
        out = Digest()
        # (from, to, second) -> [count, first wall, reason]; dicts keep insertion order.
        fallbacks: dict[tuple[str, str, int], list] = {}
        entries: list[tuple[float, Text | tuple[str, str, int]]] = []
        for e in events:
            if isinstance(e, ev.FellBack):
                k = (e.from_model, e.to_model, int(e.wall))
                if k not in fallbacks:
                    fallbacks[k] = [0, e.wall, e.reason]
                    entries.append((e.wall, k))
                fallbacks[k][0] += 1
            elif isinstance(e, ev.BreakerChanged):
                entries.append((e.wall, fmt.breaker_line(e)))
                self._breaker_toast(e, out)
            elif isinstance(e, ev.KeyParked):
                entries.append((e.wall, fmt.key_line(e)))
                self._toast(out, e.target, e.at, Toast(f"key {e.key_alias} of {e.target}: {e.kind}", "warning", "Key parked"))
            elif isinstance(e, ev.ModelPinned):
                entries.append((e.wall, fmt.pin_line(e)))
            elif isinstance(e, ev.Notice):
                entries.append((e.wall, fmt.notice_line(e)))
                if e.level == "error":
                    self._toast(out, f"notice:{e.message}", e.at, Toast(e.message, "error", "Error"))
        for wall, entry in entries:
            if isinstance(entry, tuple):
                n, _, reason = fallbacks[entry]
                entry = fmt.fallback_line(entry[0], entry[1], n, reason)
            if len(out.lines) < self.max_lines:
                out.lines.append((wall, entry))
            else:
                out.left_out += 1
        return out

    def _breaker_toast(self, e: ev.BreakerChanged, out: Digest) -> None:
        if e.new == "open":
            cool = f"; cool-down {fmt.duration(e.cooldown_until - e.at)}" if e.cooldown_until is not None else ""
            self._toast(out, e.target, e.at, Toast(f"{e.model}: {e.reason}{cool}", "warning", "Breaker tripped"))
        elif e.new == "forced-open":
            # A person did this: always confirm it, never throttled.
            self._toast(out, None, e.at, Toast(f"{e.model} takes no traffic until reset", "warning", "Tripped by hand"))

    def _toast(self, out: Digest, key: str | None, at: float, toast: Toast) -> None:
        if key is not None:
            last = self._last_toast.get(key)
            if last is not None and at - last < self.toast_every:
                return
        if len(out.toasts) >= self.max_toasts:
            return
        if key is not None:
            self._last_toast[key] = at
        out.toasts.append(toast)
