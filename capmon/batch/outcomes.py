"""What an answer or a failure makes of a batch item: the runner's outcome policy.

* An answer is stored as done, unless it is larger than ``client.max_response_bytes``:
  then the item fails as ``oversized`` and the audit trail says why.
* Capacity, rate limiting, transient errors, an unreachable endpoint and a deadline park the item: it comes back
  after a growing delay (the scheduler's), never failed for capacity reasons.
* Auth, quota and an endpoint never reached halt the job: every other item would fail
  the same way, so the item goes back to pending and the error says what to fix.
* Anything else fails the item with the client's words for it.

Pure decisions, but for the audit rows they write (a park or a refusal is a decision
the audit trail keeps): the runner applies a :class:`Verdict` (writer, scheduler, halt).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from capmon.audit import AuditLog, RunnerDecision
from capmon.batch.sqlite import Outcome, StoredItem
from capmon.batch.states import BatchKind, ItemState
from capmon.core.base.clock import Clock
from capmon.core.base.exceptions import (
    BatchError,
    CannotWait,
    CapmonError,
    DeadlineExceeded,
    RequestFailed,
    Unavailable,
)
from capmon.core.types.config import Config
from capmon.core.types.failure import Kind
from capmon.core.types.result import Attempt, ChatResult, Decision, sent

# Kinds the runner parks: they say "not now", not "never" (an unreachable endpoint may be
# mended while the job runs: its items wait for it rather than fail).
PARK_KINDS = frozenset({Kind.CAPACITY, Kind.RATE_LIMITED, Kind.TRANSIENT, Kind.UNREACHABLE})
# Kinds that say "not with this key": the job halts until a person fixes it.
HALT_KINDS = frozenset({Kind.AUTH, Kind.QUOTA})
MAX_ERROR_MESSAGE = 2000  # characters of an error message stored with an item

_SURROGATE = re.compile("[\ud800-\udfff]")

# (ok, model, kind) of a finished item, for its BatchItemDone.
Finish = tuple[bool, str | None, str | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with an item: write ``outcome`` (``finished`` when it is done or failed,
    counted once committed); ``park``: the item as parked and its delay, for the scheduler;
    ``halt``: the error that halts the job."""

    outcome: Outcome
    finished: Finish | None = None
    park: tuple[StoredItem, float] | None = None
    halt: BatchError | None = None


def utf8_size(text: str) -> tuple[int, str]:
    """(bytes, text) of an answer as stored: a lone surrogate (a JSON "\\ud800") cannot
    be stored, so it becomes U+FFFD."""
    if text.isascii():
        return len(text), text
    try:
        return len(text.encode("utf-8")), text
    except UnicodeEncodeError:
        text = _SURROGATE.sub("\ufffd", text)
        return len(text.encode("utf-8")), text


def cap_message(message: str | None) -> str | None:
    if message is None or len(message) <= MAX_ERROR_MESSAGE:
        return message
    return message[: MAX_ERROR_MESSAGE - 1] + "…"


def failed(item: StoredItem, attempts: int, first: str | None, kind: str, message: str | None) -> Outcome:
    """An item that failed for good, with why."""
    return Outcome(
        item.key,
        ItemState.FAILED,
        attempts=attempts,
        parks=item.parks,
        first_model=first,
        error_kind=kind,
        error_message=message,
    )


def back(item: StoredItem, attempts: int | None = None, first: str | None = None) -> Outcome:
    """Back to pending, as it was (a parked item keeps its parks and due time)."""
    return Outcome(
        item.key,
        ItemState.PENDING,
        attempts=item.attempts if attempts is None else attempts,
        parks=item.parks,
        not_before=item.not_before,
        first_model=first or item.first_model,
    )


class OutcomePolicy:
    """``park_delay(parks, hint)`` is the scheduler's; ``audit`` gets the runner's decisions."""

    def __init__(
        self,
        job: str,
        config: Config,
        clock: Clock,
        audit: AuditLog,
        park_delay: Callable[[int, float | None], float],
    ) -> None:
        self.job = job
        self.config = config
        self.clock = clock
        self.audit = audit
        self.park_delay = park_delay
        self.max_response_bytes = config.client.max_response_bytes

    def done(self, item: StoredItem, result: ChatResult) -> Verdict:
        # The model it counted on first (a first choice passed over counts: its fallback is one).
        first = item.first_model or result.requested or _first_sent(result.attempts) or result.model
        attempts = item.attempts + len(sent(result.attempts))  # a target passed over is no attempt
        size, content = utf8_size(result.content or "")
        if size > self.max_response_bytes:
            return self._oversized(item, result, size, attempts, first)
        usage = result.usage if isinstance(result.usage, dict) else dict(result.usage or {})
        sent_max: int | None
        try:
            cap = self.config.model(result.model).max_tokens
            sent_max = min(item.max_tokens or cap, cap)
        except KeyError:
            sent_max = item.max_tokens
        outcome = Outcome(
            item.key,
            ItemState.DONE,
            attempts=attempts,
            parks=item.parks,
            first_model=first,
            model=result.model,
            endpoint=result.endpoint,
            content=content if result.content is not None else None,
            fell_back=result.fell_back or first != result.model,
            max_tokens=sent_max,
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
            latency=result.latency,
        )
        return Verdict(outcome, (True, result.model, None))

    def _oversized(self, item: StoredItem, result: ChatResult, size: int, attempts: int, first: str | None) -> Verdict:
        reason = (
            f"the answer from {result.model} is {size:,} bytes, over client.max_response_bytes "
            f"({self.max_response_bytes:,}): not stored"
        )
        last = result.attempts[-1] if result.attempts else None
        self.audit.decision(
            RunnerDecision.REFUSE,
            job=self.job,
            item=item.id,
            attempt=attempts,
            model=result.model,
            endpoint=result.endpoint,
            key_alias=last.key_alias if last else None,
            status=last.status if last else None,
            kind=Kind.OVERSIZED,
            reason=reason,
        )
        return Verdict(failed(item, attempts, first, Kind.OVERSIZED, reason), (False, None, Kind.OVERSIZED))

    def request_failed(self, item: StoredItem, e: RequestFailed) -> Verdict:
        kind = e.failure.kind
        attempts = item.attempts + len(sent(e.attempts))
        first = item.first_model or _first_sent(e.attempts)
        if isinstance(e, CannotWait) and e.why is Unavailable.UNREACHABLE:
            # No endpoint the item may use was ever reached: every item would fail the same
            # way until a person mends the address, the proxy or the network.
            return Verdict(back(item, attempts, first), halt=BatchError(halt_message(self.job, kind, str(e))))
        if isinstance(e, DeadlineExceeded) or kind in PARK_KINDS:
            return self._park(item, e, attempts, first)
        if kind in HALT_KINDS:
            return Verdict(back(item, attempts, first), halt=BatchError(halt_message(self.job, kind, str(e))))
        return Verdict(failed(item, attempts, first, kind, cap_message(str(e))), (False, None, kind))

    def raised(self, item: StoredItem, e: Exception) -> Verdict:
        """The client raised what it should not (a bug, kept visible) or a CapmonError that is no RequestFailed."""
        kind = BatchKind.INTERNAL if not isinstance(e, CapmonError) else BatchKind.ERROR
        message = cap_message(f"{type(e).__name__}: {e}")
        return Verdict(failed(item, item.attempts, item.first_model, kind, message), (False, None, kind))

    def _park(self, item: StoredItem, e: RequestFailed, attempts: int, first: str | None) -> Verdict:
        parks = item.parks + 1
        hint = e.failure.retry_after
        delay = self.park_delay(parks, hint)
        last: Attempt | None = e.attempts[-1] if e.attempts else None
        self.audit.decision(
            RunnerDecision.PARK,
            job=self.job,
            item=item.id,
            attempt=attempts,
            model=last.model if last else None,
            endpoint=last.endpoint if last else None,
            key_alias=last.key_alias if last else None,
            status=e.failure.status,
            kind=e.failure.kind,
            hint=hint,
            wait=delay,
            reason=f"parked for {delay:.1f}s (park {parks}): {e}",
        )
        due_wall = self.clock.wall() + delay
        parked = dataclasses.replace(item, attempts=attempts, parks=parks, not_before=due_wall, first_model=first)
        outcome = Outcome(
            item.key, ItemState.PARKED, attempts=attempts, parks=parks, not_before=due_wall, first_model=first
        )
        return Verdict(outcome, park=(parked, delay))


def _first_sent(attempts: Sequence[Attempt]) -> str | None:
    """The model of the first attempt sent (skips are no attempts)."""
    return next((a.model for a in attempts if a.decision is not Decision.SKIP), None)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def halt_message(job: str, kind: Kind, detail: str) -> str:
    if kind is Kind.AUTH:
        what = (
            "the provider refused the key (401/403): that is the key, not capacity; fix the key (or the model's access)"
        )
    elif kind is Kind.UNREACHABLE:
        what = (
            "no endpoint the items may use could be reached, and none has answered since the job started: "
            "that is the address, DNS, a proxy or TLS, not capacity; fix the endpoint's base_url or the network"
        )
    else:
        what = (
            "a quota or spend limit is used up: that is billing, not capacity, and retrying will not help; "
            "raise the limit or wait for its reset"
        )
    return f"job {job!r} halted: {what}, then run `capmon batch resume {job}`. Last error: {detail}"
