"""Probe workers: one small request per target at a steady interval.

A probe goes through the target's breaker like any other request (see
:meth:`FallbackClient.probe`): while a breaker is half-open the probe is what
decides whether the model ramps back up, so a model recovers even when no traffic
happens to be routed to it. While the breaker is closed, probes keep the latency
and last status columns of the dashboard fresh.

No Textual here: the dashboard runs :meth:`ProbeWorker.run_target` as one worker
per target, and anything else (a script, ``capmon status --probe``) can too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capmon.core.base.clock import Clock
from capmon.core.routing.client import FallbackClient, ProbeResult

log = logging.getLogger("capmon.probe")

# A probe due when an open breaker's next probe is waits this little longer, so the
# breaker surely takes it when it is asked.
_AFTER_COOLDOWN = 0.05


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """The last probe of one target, for people to read."""

    at: float  # clock time the probe finished
    result: ProbeResult


class ProbeWorker:
    """Probes every target of ``client`` every ``interval`` seconds."""

    def __init__(
        self,
        client: FallbackClient,
        interval: float,
        *,
        clock: Clock | None = None,
        on_result: Callable[[ProbeResult], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"probe interval must be positive, got {interval!r}")
        self.client = client
        self.interval = interval
        self.clock = clock or client.clock
        self.on_result = on_result
        self.last: dict[str, ProbeRecord] = {}
        self.sent = 0

    @property
    def target_ids(self) -> list[str]:
        return [t.id for t in self.client.targets]

    def _target(self, target_id: str) -> Any:
        for t in self.client.targets:
            if t.id == target_id:
                return t
        raise KeyError(f"no target {target_id!r}")

    def next_delay(self, target_id: str) -> float:
        """Seconds until this target's next probe: the interval, or sooner when an open
        breaker's probe is due first."""
        t = self._target(target_id)
        delay = self.interval
        until = t.state.probe_due_at()
        if until is not None:
            delay = min(delay, max(0.0, until - self.clock.now()) + _AFTER_COOLDOWN)
        return delay

    async def probe_once(self, target_id: str) -> ProbeResult:
        self._target(target_id)
        # A probe takes a slot like any request (sent on top of a full model it would
        # only earn a self-inflicted "overloaded"), so on a busy target it waits its turn,
        # for at most one interval: by then the next probe is due anyway.
        result = await self.client.probe(target_id, wait=self.interval)
        if result.ok is not None:
            self.sent += 1
        self.last[target_id] = ProbeRecord(self.clock.now(), result)
        if self.on_result is not None:
            self.on_result(result)
        return result

    async def run_target(self, target_id: str, *, offset: float = 0.0) -> None:
        """Probe one target until cancelled. ``offset`` staggers the first probe so
        that targets are not all probed in the same instant."""
        if offset > 0:
            await self.clock.sleep(offset)
        while True:
            await self.probe_once(target_id)
            await self.clock.sleep(self.next_delay(target_id))

    def offsets(self) -> dict[str, float]:
        """A first-probe offset per target, spread over one interval."""
        ids = self.target_ids
        step = self.interval / max(1, len(ids))
        return {tid: i * step for i, tid in enumerate(ids)}
