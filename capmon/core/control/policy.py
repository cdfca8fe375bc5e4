"""What each kind of failure does: one table for requests and probes alike.

A finished attempt has two consequences, and both are read from :data:`POLICY`:

* what it tells the target's state (breaker, limiter, key), applied by the state
  store in one ``settle`` call (see capmon/core/control/seam.py);
* what the request does next (fall back, wait, retry the same model, fail), decided
  by the router.

A probe is settled through the same table, so a connection failure means the same
thing to a probe as to a request. See ARCHITECTURE.md, "Kinds and what they do".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from capmon.core.types.failure import (
    INFERENCE_PROFILE_REQUIRED,
    MODEL_NOT_FOUND,
    SILENT,
    UNSUPPORTED_FEATURE,
    Failure,
    Kind,
)


class BreakerSignal(enum.StrEnum):
    SUCCESS = "success"
    CAPACITY = "capacity"  # counts toward a trip when the limiter takes it as news
    DOWN = "down"  # nothing reached the server: counts toward a trip, always
    SILENT = "silent"  # no response headers in time: trips at once (like down, no capacity lesson)
    TRANSIENT = "transient"  # a broken answer: fails a probe, says nothing to a closed breaker
    NEUTRAL = "neutral"  # says nothing about the model (auth, quota, bad request, cancelled)


class LimiterSignal(enum.StrEnum):
    OK = "ok"  # room was there: additive increase
    OVERLOAD = "overload"  # the target was full: learn its capacity
    NEUTRAL = "neutral"


class KeyAction(enum.StrEnum):
    NONE = "none"
    DISABLE = "disable"  # auth: the key is disabled for every model until reset by hand
    PARK = "park"  # quota: this model on this key is parked until the hint (or an hour)


class Next(enum.StrEnum):
    """What the request does after the attempt."""

    DONE = "done"
    FALLBACK_OR_WAIT = "fallback_or_wait"  # another model now if one admits, else back off
    SAME_MODEL = "same_model"  # the same model after the hint (another key if one has room)
    RETRY = "retry"  # the same model after a short backoff, from the retry budget
    FALLBACK = "fallback"  # never this target again for this request; any other
    LARGER = "larger"  # only a model with a larger context window
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Policy:
    breaker: BreakerSignal
    limiter: LimiterSignal
    key: KeyAction
    next: Next
    hint_blocks: bool = False  # a server hint stops the whole target (when none of ours is in flight)


SUCCESS = Policy(BreakerSignal.SUCCESS, LimiterSignal.OK, KeyAction.NONE, Next.DONE)
CANCELLED = Policy(BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, KeyAction.NONE, Next.FAIL)

POLICY: dict[Kind, Policy] = {
    Kind.CAPACITY: Policy(
        BreakerSignal.CAPACITY, LimiterSignal.OVERLOAD, KeyAction.NONE, Next.FALLBACK_OR_WAIT, hint_blocks=True
    ),
    Kind.RATE_LIMITED: Policy(
        BreakerSignal.NEUTRAL, LimiterSignal.OVERLOAD, KeyAction.NONE, Next.SAME_MODEL, hint_blocks=True
    ),
    Kind.QUOTA: Policy(BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, KeyAction.PARK, Next.FALLBACK),
    Kind.AUTH: Policy(BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, KeyAction.DISABLE, Next.FALLBACK),
    Kind.TOO_LARGE: Policy(BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, KeyAction.NONE, Next.LARGER),
    Kind.BAD_REQUEST: Policy(BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, KeyAction.NONE, Next.FAIL),
    Kind.TRANSIENT: Policy(BreakerSignal.TRANSIENT, LimiterSignal.NEUTRAL, KeyAction.NONE, Next.RETRY),
    # A model that sends hundreds of megabytes is broken, not busy: never that target again.
    Kind.OVERSIZED: Policy(BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, KeyAction.NONE, Next.FALLBACK),
    # The request provably never reached the server: the endpoint is down, which is news
    # for the breaker (so the prober finds out when it answers again), and no retry budget
    # is spent (nobody was hammered). Whether the request waits for it at all is routing's
    # rule (capmon/core/routing/route.py, Routing.cannot_wait): not for an endpoint never reached.
    Kind.UNREACHABLE: Policy(BreakerSignal.DOWN, LimiterSignal.NEUTRAL, KeyAction.NONE, Next.FALLBACK_OR_WAIT),
}


# Failures whose code says more than their kind (capmon/core/types/failure.py): a row of their own.
BY_CODE: dict[str, Policy] = {
    # A silent route (no response headers within the first-token limit, or a plain
    # attempt's whole timeout): counted like a capacity failure, but it opens the breaker at
    # once, so the next requests pass it over (Skip.SILENT) until its probe answers; the
    # request falls over at once if another target admits it, else waits in line (never a
    # retry on that route). No capacity lesson for the limiter: an outage is not one.
    # A slow first token (FIRST_TOKEN) is a plain capacity failure: the CAPACITY row.
    SILENT: Policy(BreakerSignal.SILENT, LimiterSignal.NEUTRAL, KeyAction.NONE, Next.FALLBACK_OR_WAIT),
    # The target's model is not there (a deployment id mistyped, a model not enabled in that
    # project or region): nothing the request did, so it is not failed for it. The target is
    # parked (for the server's hint, or an hour) as a quota is, and shown so on the dashboard;
    # the request goes on to another deployment of its model or to the next model.
    MODEL_NOT_FOUND: Policy(BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, KeyAction.PARK, Next.FALLBACK),
    # Bedrock's model id that must be called through an inference profile: the same fact
    # about the target (it can serve nothing as configured), the same parking.
    INFERENCE_PROFILE_REQUIRED: Policy(BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, KeyAction.PARK, Next.FALLBACK),
    # The model does not support a feature the request uses (tools, a JSON schema, images,
    # reasoning): a fact about the model there, not about its key or capacity, and not the
    # request's fault while another model can serve it. The client marks that deployment as
    # lacking the feature for the process (so later requests that need it skip it), and this
    # one goes on to the next model that may have it.
    UNSUPPORTED_FEATURE: Policy(BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, KeyAction.NONE, Next.FALLBACK),
}


def policy_for(failure: Failure | None) -> Policy:
    if failure is None:
        return SUCCESS
    if failure.code is not None:
        own = BY_CODE.get(failure.code)
        if own is not None:
            return own
    return POLICY[failure.kind]
