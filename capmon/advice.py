"""`capmon report JOB --advice`: what to change, read from the audit trail.

Checks run in the order a person would look: a refused key first (nothing else
matters until it is fixed), then billing, then where capacity ran out, then rate
limits against the concurrency used, then max_tokens against what answers used,
then items that failed for their own reasons. Every line carries its figures, in
the text and in ``figures`` for machines.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from capmon.batch.figures import JobReport, KeyRow
from capmon.batch.states import BatchKind
from capmon.core.types.failure import Kind

# Thresholds, with why.
CONCENTRATED = 0.6  # share of capacity errors on one model that means "that model, not the provider"
MIN_ERRORS = 5  # fewer errors than this are noise, not a pattern
RATE_LIMITED_SHARE = 0.05  # 429 rate_limited on more than 5% of attempts is worth a change
HIGH_CONCURRENCY = 8  # at or above this the advice is to lower it; below, to set a --rate
MAX_TOKENS_FACTOR = 4.0  # asking for 4x the p99 answer is "far above"
MIN_TOKEN_ITEMS = 10


class Topic(enum.StrEnum):
    AUTH = Kind.AUTH.value
    QUOTA = Kind.QUOTA.value
    CAPACITY = Kind.CAPACITY.value
    RATE_LIMITED = Kind.RATE_LIMITED.value
    MAX_TOKENS = "max_tokens"
    TRANSIENT = Kind.TRANSIENT.value
    FAILURES = "failures"
    OK = "ok"


@dataclass(frozen=True)
class Advice:
    topic: Topic
    text: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "text": self.text, "figures": self.figures}


def _pct(n: int, d: int) -> str:
    return f"{n / d:.0%}" if d else "-"


def _resume(r: JobReport) -> str:
    return f"`capmon batch resume {r.job}`"


def _keys(r: JobReport, topic: Topic, count: Callable[[KeyRow], int], what: str, fix: str) -> Advice | None:
    """Keys that refused attempts for a reason of the key's own (auth, quota): nothing else
    matters until they are fixed."""
    bad = [k for k in r.keys if count(k)]
    if not bad:
        return None
    n = sum(count(k) for k in bad)
    where = ", ".join(f"{k.key_alias} at {k.endpoint} ({count(k)})" for k in bad)
    return Advice(
        topic,
        f"{n} attempts {what} {where}: {fix}, then {_resume(r)}.",
        {"attempts": n, "keys": {k.key_alias: count(k) for k in bad}},
    )


def auth(r: JobReport) -> Advice | None:
    return _keys(
        r,
        Topic.AUTH,
        lambda k: k.auth,
        "were refused with 401/403 (auth) by key",
        "that is the key, not capacity. Check the environment variable behind it, the key's permissions for "
        "these models",
    )


def quota(r: JobReport) -> Advice | None:
    return _keys(
        r,
        Topic.QUOTA,
        lambda k: k.quota,
        "hit a quota or spend limit on key",
        "that is billing, not load, and retrying will not help. Raise the limit or add a key with its own quota",
    )


def capacity(r: JobReport) -> Advice | None:
    per_model = {m.model: m.by_kind.get(Kind.CAPACITY, 0) for m in r.models}
    total = sum(per_model.values())
    if total < MIN_ERRORS:
        return None
    top, top_n = max(per_model.items(), key=lambda kv: kv[1])
    parked = r.parks_by_kind.get(Kind.CAPACITY, 0)
    figures = {"capacity_errors": total, "by_model": per_model, "fell_back_items": r.fell_back_items, "parks": parked}
    if top_n / total >= CONCENTRATED:
        to = [(b, n) for a, b, n in r.fallback_pairs if a == top]
        moved = ", ".join(f"{b} {n}" for b, n in to) or "none"
        text = (
            f"capacity errors are concentrated on {top}: {top_n} of {total} ({_pct(top_n, total)}). "
            f"Items moved from it to {moved}"
        )
        if parked:
            text += (
                f"; but {parked} times no model had room and items were parked: a tier is missing. "
                f"Add another model or endpoint after the last one in the config."
            )
        else:
            text += (
                ": its breaker and the fallbacks are doing their work; nothing to change unless "
                f"you need {top} itself (then run off-peak with --window)."
            )
        figures["model"] = top
        return Advice(Topic.CAPACITY, text, figures)
    spread = ", ".join(f"{m} {n}" for m, n in sorted(per_model.items(), key=lambda kv: -kv[1]) if n)
    text = (
        f"capacity errors are spread over the models ({spread}, {total} in all): the provider is short overall. "
        f"Lower --concurrency, run off-peak with --window, or add an endpoint with its own capacity"
    )
    text += f"; {parked} times items had to be parked." if parked else "."
    return Advice(Topic.CAPACITY, text, figures)


def rate_limited(r: JobReport) -> Advice | None:
    n = r.by_kind.get(Kind.RATE_LIMITED, 0)
    if n < MIN_ERRORS or not r.attempts or n / r.attempts < RATE_LIMITED_SHARE:
        return None
    concurrency = r.settings.get("concurrency")
    rate = r.settings.get("rate")
    ok = sum(m.ok for m in r.models)
    achieved = ok / r.active_seconds if r.active_seconds else None
    figures = {
        "rate_limited": n,
        "attempts": r.attempts,
        "share": round(n / r.attempts, 3),
        "concurrency": concurrency,
        "rate": rate,
        "achieved_per_second": None if achieved is None else round(achieved, 2),
    }
    base = f"{n} of {r.attempts} attempts ({_pct(n, r.attempts)}) were 429 rate_limited"
    suggest_rate = max(0.1, round((achieved or 1.0) * 0.85, 1))
    if isinstance(concurrency, int) and concurrency >= HIGH_CONCURRENCY:
        text = (
            f"{base} at --concurrency {concurrency}: lower it to {max(1, concurrency // 2)}, or set "
            f"--rate {suggest_rate} (85% of the {achieved or 0:.1f} answers/s the job got)."
        )
        figures["suggested_concurrency"] = max(1, concurrency // 2)
    else:
        text = (
            f"{base}" + (f" at --rate {rate}" if rate else "") + f": set --rate {suggest_rate} "
            f"(85% of the {achieved or 0:.1f} answers/s the job got), or add a key with its own limit."
        )
    figures["suggested_rate"] = suggest_rate
    return Advice(Topic.RATE_LIMITED, text, figures)


def _round_up(x: float, step: int = 32) -> int:
    return int(-(-x // step) * step)


def max_tokens(r: JobReport) -> Advice | None:
    t = r.tokens
    if t.items < MIN_TOKEN_ITEMS or not t.requested_median or t.used_p99 is None:
        return None
    if t.requested_median < MAX_TOKENS_FACTOR * max(1, t.used_p99):
        return None
    suggest = max(16, _round_up(t.used_max * 1.25 if t.used_max else t.used_p99 * 1.5))
    return Advice(
        Topic.MAX_TOKENS,
        f"items asked for max_tokens {t.requested_median} (median of {t.items}) but answers used "
        f"{t.used_median} (p95 {t.used_p95}, p99 {t.used_p99}, max {t.used_max}): lower max_tokens "
        f"to about {suggest}. Token-per-minute limits count max_tokens up front, so a lower value "
        f"lets more requests in at once.",
        {
            "requested_median": t.requested_median,
            "used_median": t.used_median,
            "used_p95": t.used_p95,
            "used_p99": t.used_p99,
            "used_max": t.used_max,
            "items": t.items,
            "suggested": suggest,
        },
    )


def transient(r: JobReport) -> Advice | None:
    n = r.by_kind.get(Kind.TRANSIENT, 0)
    if n < MIN_ERRORS or n / max(1, r.attempts) < RATE_LIMITED_SHARE:
        return None
    statuses = {k: v for k, v in r.by_status.items() if k in ("none", "500", "502", "504")}
    return Advice(
        Topic.TRANSIENT,
        f"{n} of {r.attempts} attempts ({_pct(n, r.attempts)}) were timeouts, resets or 5xx "
        f"({', '.join(f'{k} {v}' for k, v in statuses.items()) or 'no status'}): check the network "
        f"path and [client] attempt_timeout; these are retried, but each costs a wait.",
        {"transient": n, "attempts": r.attempts, "by_status": statuses},
    )


def failures(r: JobReport) -> Advice | None:
    if not r.failed:
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in r.failures.items())
    lines = ", ".join(str(line) for line, *_ in r.failed_samples[:5])
    hint: dict[str, str] = {
        BatchKind.BAD_INPUT: "fix those lines",
        Kind.BAD_REQUEST: "the provider refused them as sent",
        Kind.TOO_LARGE: "they do not fit any model's context window",
        Kind.OVERSIZED: (
            "their answers were larger than client.max_response_bytes and were not stored: raise it in "
            "[client], or ask for fewer tokens"
        ),
    }
    why = "; ".join(hint[k] for k in r.failures if k in hint)
    return Advice(
        Topic.FAILURES,
        f"{r.failed} items failed for reasons of their own ({kinds}; first lines {lines})"
        + (f": {why}" if why else "")
        + ". Run them again as a new job once fixed.",
        {"failed": r.failed, "by_kind": dict(r.failures), "lines": [s[0] for s in r.failed_samples]},
    )


CHECKS: tuple[Callable[[JobReport], Advice | None], ...] = (
    auth,
    quota,
    capacity,
    rate_limited,
    max_tokens,
    transient,
    failures,
)


def advise(r: JobReport) -> list[Advice]:
    out = [a for check in CHECKS if (a := check(r)) is not None]
    if not out:
        errors = sum(r.by_kind.values())
        out.append(
            Advice(
                Topic.OK,
                f"nothing to change: {r.done} of {r.total} items done in {r.attempts} attempts, "
                f"{errors} errors ({_pct(errors, r.attempts)}), {r.fell_back_items} fell back.",
                {"done": r.done, "attempts": r.attempts, "errors": errors},
            )
        )
    return out
