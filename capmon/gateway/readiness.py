"""Whether the gateway can serve: some model admits now, or will within a request's
deadline (its breaker's probe is due, a server's hint or a quota runs out); and, for a
429's Retry-After, when the soonest of them is."""

from __future__ import annotations

from dataclasses import dataclass

from capmon.core.routing.client import FallbackClient
from capmon.core.types.snapshot import LinkState


@dataclass(frozen=True, slots=True)
class TargetReadiness:
    target: str
    model: str
    state: str
    admits_in: float | None  # seconds until it admits (0: now); None: only a person (or its endpoint answering)
    unreachable: str | None = None  # why its endpoint, never reached, cannot be (capmon/core/routing/reach.py)

    def as_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "model": self.model,
            "state": self.state,
            "admits_in": None if self.admits_in is None else round(self.admits_in, 3),
            "unreachable": self.unreachable,
        }


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str
    targets: tuple[TargetReadiness, ...]
    shared: str = ""  # "shared state: ok | degraded" when the state is shared (capmon/fleet)

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "ready": self.ready,
            "reason": self.reason,
            "targets": [t.as_json() for t in self.targets],
        }
        if self.shared:
            out["shared"] = self.shared
        return out


def _targets(client: FallbackClient) -> tuple[TargetReadiness, ...]:
    admits_in = client.admits_in()
    out = []
    for t in client.snapshot().targets:
        state = str(t.state) if t.key_state == "ok" else f"{t.state}, key {t.key_state}"
        out.append(TargetReadiness(t.target, t.model, state, admits_in.get(t.target), t.unreachable_reason))
    return tuple(out)


def readiness(client: FallbackClient) -> Readiness:
    """Ready or not, and why; a degraded shared state keeps the gateway ready (it serves
    on local state) but says so, so a load balancer's operator sees it."""
    found = _readiness(client)
    shared = client.state.shared_status()  # not a whole snapshot: _readiness took one
    if shared.state is LinkState.OFF:
        return found
    reason = f"{found.reason}; {shared.label}" if shared.state is LinkState.DEGRADED else found.reason
    return Readiness(found.ready, reason, found.targets, shared.label)


def _readiness(client: FallbackClient) -> Readiness:
    deadline = client.config.client.deadline
    targets = _targets(client)
    waits = [t for t in targets if t.admits_in is not None]
    now_ = [t for t in waits if t.admits_in == 0.0]
    if now_:
        return Readiness(True, f"{now_[0].model} admits now", targets)
    soon = sorted(
        (t for t in waits if t.admits_in is not None and t.admits_in <= deadline), key=lambda t: t.admits_in or 0.0
    )
    if soon:
        return Readiness(
            True, f"{soon[0].model} admits in {soon[0].admits_in:.1f}s, within the {deadline:g}s deadline", targets
        )
    if waits:
        first = min(waits, key=lambda t: t.admits_in or 0.0)
        return Readiness(
            False,
            f"no model admits within the {deadline:g}s deadline; the soonest is "
            f"{first.model} in {first.admits_in:.0f}s",
            targets,
        )
    unreachable = list(dict.fromkeys(t.unreachable for t in targets if t.unreachable))
    if unreachable:
        rest = "" if len(unreachable) == len(targets) else "; the others are tripped by hand or their keys disabled"
        return Readiness(False, f"no model can admit a request: {'; '.join(unreachable)}{rest}", targets)
    return Readiness(False, "no model can admit a request: every one is tripped by hand or its key disabled", targets)


def retry_after(client: FallbackClient) -> float:
    """Seconds until the soonest model admits again (1 when one admits now: it is busy)."""
    waits = [t.admits_in for t in _targets(client) if t.admits_in is not None and t.admits_in > 0]
    return min(waits) if waits else 1.0
