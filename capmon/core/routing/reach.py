"""What this process has seen of each endpoint's reachability: whether it ever answered,
and whether its last attempt could not connect at all (DNS, refused, TLS, proxy, connect
timeout: errors.Kind.UNREACHABLE).

A wrong ``base_url``, a proxy, DNS or TLS look like nothing else: no model answers, so a
request that waited for one would wait until its deadline and then read as "at capacity".
Routing reads this to answer at once instead (capmon/core/routing/route.py, ``Routing.cannot_wait``:
a request waits only for an endpoint that has answered since the process started), and the
log says it once per endpoint and cause, then a count, never a line per request.

One :class:`Reach` per endpoint, shared by its targets (capmon/core/routing/targets.py), written
by the executor after every attempt, a probe's included (capmon/core/routing/executor.py). It is
this process's own view: in a fleet the breakers are shared, what was reached is not.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import httpx

from capmon.core.types.failure import Failure

log = logging.getLogger("capmon.client")

# While an endpoint stays unreachable the log counts its failures in a line at most this often.
COUNT_EVERY = 60.0


def host_of(base_url: str) -> str:
    """The host (and port, when one is given) of a base URL: what a DNS or connect failure
    is about, and never a key (a URL's user info, path and query are left out)."""
    try:
        url = httpx.URL(base_url)
    except Exception:
        return "?"
    host = url.host or "?"
    return f"{host}:{url.port}" if url.port is not None else host


@dataclass(eq=False)
class Reach:
    endpoint: str
    host: str
    answered: bool = False  # some answer (any status) since the process started
    failure: Failure | None = None  # the last attempt's, while it could not connect; None once it answers
    since: float | None = None  # clock time the current run of unreachable failures began
    failures: int = 0  # failures in that run
    # The log: per cause, when its last line was written and the failures since, so an
    # endpoint that flaps (a restart loop) is told once a minute, not once a flap.
    _lines: dict[str, float] = field(default_factory=dict, repr=False)
    _untold: dict[str, int] = field(default_factory=dict, repr=False)
    _told_run: bool = False  # the current run's first failure was told: its end is told too

    def lost(self, failure: Failure, now: float) -> Failure:
        """An attempt could not connect: the failure, its reason naming the endpoint (a
        classifier knows the exception, not where it was going)."""
        where = f"endpoint {self.endpoint} ({self.host})"
        named = dataclasses.replace(failure, reason=f"{where} is unreachable: {failure.reason}")
        if self.failure is None:
            self.since, self.failures, self._told_run = now, 0, False
        self.failure = named
        self.failures += 1
        cause = failure.code or "?"
        last = self._lines.get(cause)
        if last is None or now - last >= COUNT_EVERY:
            untold = self._untold.get(cause, 0)
            self._lines[cause], self._untold[cause] = now, 0
            if last is None or not untold:
                then = "" if self.answered else "; requests do not wait for it until it answers"
                log.warning("%s%s", named.reason, then)
            else:
                log.warning(
                    "%s is still unreachable (%s): %d more failure(s) in the last %.0fs",
                    where,
                    cause,
                    untold + 1,
                    now - last,
                )
            self._told_run = True
        else:
            self._untold[cause] = self._untold.get(cause, 0) + 1
        return named

    def reached(self, now: float) -> None:
        """An answer came (any status): the endpoint is reachable."""
        self.answered = True
        if self.failure is None:
            return
        if self._told_run:
            log.warning(
                "endpoint %s (%s) answers again after %d unreachable failure(s) over %.0fs",
                self.endpoint,
                self.host,
                self.failures,
                now - (self.since if self.since is not None else now),
            )
        self.failure, self.since, self.failures, self._told_run = None, None, 0, False

    @property
    def cause(self) -> str | None:
        """Why it cannot be reached now (the failure's reason), or None."""
        return self.failure.reason if self.failure is not None else None
