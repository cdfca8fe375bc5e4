"""Recovery driven by demand: how soon the next probe of an open breaker is worth sending.

An open breaker learns that its model is back only by a probe, and knowing is worth more
the more work wants that model meanwhile. The router counts that work: each request that
prefers a target whose breaker is open, and is served by another target or waits, is
:meth:`Demand.want` once. Each earns the target ``[breaker] probe_share`` of a probe; a
probe is due by demand once a whole one is earned and ``[breaker] probe_floor`` seconds
have passed since the last probe began. So probes are at most that share of the requests
the model would have taken, their rate grows with that work, and never passes one per
floor. That share alone would leave sparse work behind: at one request every 4 s and a
share of 0.02, a probe is earned every 200 s. So a model also stays *wanted* for
``[breaker] probe_wanted_for`` seconds after the last request that preferred it, and while
it is wanted a probe is due ``probe_interval_wanted`` seconds after the last one began
(never closer than the floor), whatever the request rate: the next request after a recovery
finds the model back. Probes are thus bounded by the share of the work, or one per
``probe_interval_wanted`` while wanted, whichever allows more. With no demand the breaker's
own slow schedule (``probe_interval`` growing by ``cooldown_multiplier`` up to ``cooldown``)
is the only one; the prober
(capmon/core/routing/prober.py) sends whichever comes first, one probe at a time, and the state
(capmon/core/control/breaker.py) still holds every probe back until a server's hint has passed.

The credit is capped at one probe: work that wanted the model long ago buys no burst of
probes now. In a fleet (capmon/fleet) every process counts the work it sees and takes it
for its share of the fleet's (``scale``: the processes alive), and a probe any process
begins spends every process's credit (:meth:`Demand.heard`), so the fleet's probes stay
about that share of the fleet's demand, one at a time. See ARCHITECTURE.md, "The breaker".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from capmon.core.base.clock import Clock

_EPS = 1e-9


@dataclass(slots=True)
class _Target:
    credit: float = 0.0  # probes earned and not yet sent, at most 1
    last: float = -math.inf  # when the last probe began (or an early one was refused)
    wanted: int = 0  # requests counted since the breaker opened
    wanted_until: float = -math.inf  # the model is wanted until then (the last want + probe_wanted_for)
    since: float = -math.inf  # the first want since the breaker opened, if before any probe here


def demand_due(
    credit: float,
    last: float,
    floor: float,
    *,
    wanted_until: float = -math.inf,
    every: float = 0.0,
    since: float = -math.inf,
) -> float | None:
    """When demand makes the next probe due, the sooner of two rules. By the share: once a
    whole probe is earned (``credit``), ``floor`` seconds after the last one began. By want:
    while the model is wanted (until ``wanted_until``), ``every`` seconds (never fewer than
    ``floor``) after the last probe began or, before any, after the first want ``since`` the
    breaker opened, when that comes while it is still wanted (``every`` 0: off). None while
    neither makes one due. Pure, so every store of the state decides alike."""
    due = last + floor if credit >= 1.0 - _EPS else None
    if every > 0.0:
        at = max(last, since) + max(every, floor)
        if at <= wanted_until + _EPS and (due is None or at < due):
            due = at
    return due


class Demand:
    """Per target: the work that wants it while its breaker is open. ``on_due()`` is told
    when a target's next probe has become due by demand (the prober looks again)."""

    def __init__(
        self,
        clock: Clock,
        *,
        share: float,
        floor: float,
        on_due: Callable[[], None],
        every: float = 0.0,
        wanted_for: float = 0.0,
    ) -> None:
        self._clock = clock
        self.share = share
        self.floor = floor
        self.every = every  # [breaker] probe_interval_wanted (0: the share alone)
        self.wanted_for = wanted_for  # [breaker] probe_wanted_for
        self._on_due = on_due
        self._targets: dict[str, _Target] = {}
        self.scale = 1  # processes that share the demand (a fleet's live processes; 1 alone)

    def __contains__(self, target: str) -> bool:
        return target in self._targets

    def want(self, target: str) -> None:
        """One more request prefers ``target`` and is served elsewhere or waits."""
        wanting = self.every > 0.0 and self.wanted_for > 0.0
        if self.share <= 0.0 and not wanting:
            return
        d = self._targets.get(target)
        if d is None:  # the first want of this outage: the trip itself was news, the first probe waits
            d = self._targets[target] = _Target(since=self._clock.now())
        before = self._due(d)
        if self.share > 0.0:
            d.credit = min(1.0, d.credit + self.share * max(1, self.scale))
        if wanting:
            d.wanted_until = self._clock.now() + self.wanted_for
        d.wanted += 1
        after = self._due(d)
        if after is not None and (before is None or after < before - _EPS):
            self._on_due()

    def _due(self, d: _Target) -> float | None:
        return demand_due(d.credit, d.last, self.floor, wanted_until=d.wanted_until, every=self.every, since=d.since)

    def due(self, target: str) -> float | None:
        """Clock time the next probe of ``target`` is due by demand (None: not by demand)."""
        d = self._targets.get(target)
        return None if d is None else self._due(d)

    def wanted(self, target: str) -> int:
        """Requests that preferred ``target`` while its breaker was open, since it opened."""
        d = self._targets.get(target)
        return 0 if d is None else d.wanted

    def probed(self, target: str) -> None:
        """A probe of ``target`` began: it spends what demand earned, and the floor starts."""
        d = self._targets.get(target)
        if d is None:
            d = self._targets[target] = _Target()
        d.credit = max(0.0, d.credit - 1.0)
        d.last = self._clock.now()

    def heard(self, target: str) -> None:
        """Another process of the fleet began a probe of ``target``: it spends this one's
        credit too, and the floor starts."""
        self.probed(target)

    def refused(self, target: str) -> None:
        """An early probe was not admitted (a server's hint, another process's probe):
        nothing is spent, and the next try waits one floor."""
        d = self._targets.get(target)
        if d is not None:
            d.last = self._clock.now()

    def forget(self, target: str) -> None:
        """The breaker is no longer open: what wanted it then says nothing about the next outage."""
        self._targets.pop(target, None)
