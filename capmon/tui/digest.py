"""Turn a burst of bus events into a few log lines and toasts.

The bus can carry thousands of events a second under load; the log must stay
readable and cheap. Only the events people act on are kept (breaker moves,
fallbacks, moves between a model's deployments, key parking, pins, notices); fallbacks
are coalesced per second and model pair (a change of provider names both APIs), moves per
second, model and pair of deployments; each digest writes at most ``max_lines`` lines and says how many it
left out; toasts are throttled per target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from capmon.core.base import text
from capmon.core.control.breaker import State
from capmon.core.types import events as ev
from capmon.tui import format as fmt

LOGGED: tuple[type[ev.Event], ...] = (
    ev.BreakerChanged,
    ev.CapabilityLearned,
    ev.DeploymentMoved,
    ev.FellBack,
    ev.KeyParked,
    ev.ModelPinned,
    ev.Notice,
    ev.ProbeFinished,
    ev.RampStep,
    ev.TokenParamLearned,
)


@dataclass(frozen=True)
class Toast:
    message: str
    severity: str  # information | warning | error
    title: str = ""
    timeout: float | None = None  # seconds on screen; None: Textual's default


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
        # Moves counted until their second is over: (the event's class, who moved where...,
        # second) -> [count, first wall time, reason]. A fallback's who: (from, from api, to,
        # to api); a move between deployments': (model, from endpoint, to endpoint, to id).
        self._moves: dict[tuple[Any, ...], list[Any]] = {}
        self._crossed: set[tuple[str, str, str, str]] = set()  # (from, from api, to, to api) toasted

    @staticmethod
    def wants(event: ev.Event) -> bool:
        return isinstance(event, LOGGED)

    @property
    def holding(self) -> bool:
        """Fallback (and deployment move) counts wait for their second to end."""
        return bool(self._moves)

    def digest(self, events: list[ev.Event], *, toasts: bool = True, now_wall: float | None = None) -> Digest:
        """Lines and toasts for ``events``. Fallbacks are counted per second and model
        pair (deployment moves per second, model and pair of endpoints) and written once
        their second is over (``now_wall``; None writes them all now), so a second of
        fallbacks is one line even across several digests.
        ``toasts=False``: old events (a catch-up on open) go to the log only."""
        out = Digest()
        entries: list[tuple[float, int, Text]] = []
        for e in events:
            if isinstance(e, (ev.FellBack, ev.DeploymentMoved)):
                k: tuple[Any, ...]
                if isinstance(e, ev.FellBack):
                    if e.crosses_providers:
                        self._provider_toast(e, out)
                    k = (ev.FellBack, e.from_model, e.from_api, e.to_model, e.to_api, int(e.wall))
                else:
                    k = (ev.DeploymentMoved, e.model, e.from_endpoint, e.to_endpoint, e.to_deployment, int(e.wall))
                if k not in self._moves:
                    self._moves[k] = [0, e.wall, e.reason]
                self._moves[k][0] += 1
                continue
            line = self._line(e, out)
            if line is not None:
                entries.append((e.wall, len(entries), line))
        for k in list(self._moves):
            if now_wall is None or k[-1] < int(now_wall):
                n, wall, reason = self._moves.pop(k)
                if k[0] is ev.FellBack:
                    line = fmt.fallback_line(k[1], k[3], n, reason, from_api=k[2], to_api=k[4])
                else:
                    line = fmt.moved_line(k[1], k[2], k[3], k[4], n, reason)
                entries.append((wall, len(entries), line))
        entries.sort(key=lambda entry: entry[:2])
        for wall, _, line in entries:
            if len(out.lines) < self.max_lines:
                out.lines.append((wall, line))
            else:
                out.left_out += 1
        if not toasts:
            out.toasts.clear()
        return out

    def _line(self, e: ev.Event, out: Digest) -> Text | None:
        if isinstance(e, ev.BreakerChanged):
            self._breaker_toast(e, out)
            return fmt.breaker_line(e)
        if isinstance(e, ev.KeyParked):
            what = "disabled" if e.until is None else "parked"
            self._toast(
                out,
                e.target,
                e.at,
                Toast(
                    f"{e.model} / {e.key_alias}: {text.shorten(e.reason or e.kind, 80)}",
                    "warning",
                    f"Key {what} ({e.kind})",
                ),
            )
            return fmt.key_line(e)
        if isinstance(e, ev.ProbeFinished):
            # A health check that answered is the probe column's news, not the log's.
            return fmt.probe_line(e) if e.breaker or e.ok is False else None
        if isinstance(e, ev.RampStep):
            return fmt.ramp_line(e)
        if isinstance(e, ev.TokenParamLearned):
            self._toast(
                out,
                f"param:{e.model}",
                e.at,
                Toast(
                    f"{e.model} refused the old token parameter: sending {e.param} from now on",
                    "information",
                    "Wire quirk",
                ),
            )
            return fmt.token_param_line(e)
        if isinstance(e, ev.CapabilityLearned):
            return fmt.capability_line(e)
        if isinstance(e, ev.ModelPinned):
            return fmt.pin_line(e)
        if isinstance(e, ev.Notice):
            if e.level == "error":
                self._toast(out, f"notice:{e.message}", e.at, Toast(e.message, "error", "Error"))
            return fmt.notice_line(e)
        return None

    def _provider_toast(self, e: ev.FellBack, out: Digest) -> None:
        # The first fallback from one provider to another is news; the log counts the rest.
        pair = (e.from_model, e.from_api, e.to_model, e.to_api)
        if pair in self._crossed or len(out.toasts) >= self.max_toasts:
            return
        self._crossed.add(pair)
        what = fmt.fallback_pair(e.from_model, e.to_model, e.from_api, e.to_api).plain
        self._toast(out, None, e.at, Toast(what, "information", "Fell back across providers"))

    def _breaker_toast(self, e: ev.BreakerChanged, out: Digest) -> None:
        if e.new == State.OPEN and e.old != State.HALF_OPEN:  # a failed probe re-opens it: the log says so, no toast
            cool = f"; first probe in {text.countdown(e.cooldown_until - e.at)}" if e.cooldown_until is not None else ""
            self._toast(
                out, e.target, e.at, Toast(f"{e.model}: {e.reason}{cool}", "warning", "Breaker tripped", timeout=10.0)
            )
        elif e.new == State.FORCED_OPEN:
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
