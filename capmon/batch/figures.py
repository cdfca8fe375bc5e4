"""A job's figures, as `capmon report` shows them: read from the job store (its items and
its audit trail) into frozen dataclasses that :mod:`capmon.report` prints and
:mod:`capmon.advice` reads.

Ids come from the user's file and messages from a provider: the sentences here
(:func:`explain`) show anything that would not print as itself (a newline, a terminal
escape) as ``repr`` shows it (:func:`shown`); the data fields keep it as it is.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from capmon.audit import RUNNER_DECISIONS, AuditRow, RunnerDecision, SpendRow
from capmon.batch.compare import Agreement, job_agreement
from capmon.batch.states import ItemState
from capmon.batch.store import Store
from capmon.core.base.exceptions import BatchError
from capmon.core.base.text import percentile
from capmon.core.types.failure import Kind
from capmon.core.types.prices import Prices, Tokens, cost_of
from capmon.core.types.result import Decision

ITEMS_SHOWN_DATA = 100  # items listed per model


def shown(text: object) -> str:
    """``text`` for a terminal: as it is when every character prints, else quoted and
    escaped as ``repr`` shows it, so it can neither break a table nor send escapes."""
    s = "" if text is None else str(text)
    return s if s.isprintable() else repr(s)


@dataclass(frozen=True)
class ModelRow:
    model: str
    served: int  # items this model answered in the end
    attempts: int
    ok: int
    status_429: int
    status_503: int  # 503 and 529 (Anthropic's "overloaded")
    by_status: dict[str, int]  # every non-200 status, "none" for no response
    by_kind: dict[str, int]
    fallbacks_from: int  # attempts on this model after which the client moved on
    mean_latency: float | None  # seconds, successful attempts
    p99_latency: float | None
    items: tuple[str, ...]  # the first items it served, in input order
    apis: tuple[str, ...] = ()  # the provider APIs its attempts went to (openai, anthropic, azure)


@dataclass(frozen=True)
class TokenFigures:
    items: int  # done items with both figures
    requested_median: int | None  # max_tokens sent
    used_median: int | None  # usage.completion_tokens
    used_p95: int | None
    used_p99: int | None
    used_max: int | None


@dataclass(frozen=True)
class KeyRow:
    key_alias: str
    endpoint: str
    attempts: int
    auth: int  # 401 / 403 / kind auth
    quota: int


@dataclass(frozen=True)
class CostRow:
    """What one model's answers cost, and what the same answers would have cost on the
    preferred model (at its prices, with each answer's own token counts)."""

    model: str
    answers: int  # its answers that told their usage
    priced: int  # of them, those with a price (the rest have no cost: none was configured)
    cost: float  # USD, the priced answers', at the prices of the deployment that served each
    on_preferred: float | None  # the priced answers' tokens at the preferred model's prices; None: it has none


@dataclass(frozen=True)
class CostFigures:
    preferred: str | None  # the config's first model; None: no config was read
    models: tuple[CostRow, ...]
    cost: float  # USD over every priced answer
    on_preferred: float | None  # the same answers on the preferred model; None: it has no price
    unpriced: int  # answers that told their usage but have no price

    @property
    def gap(self) -> float | None:
        """What the fallbacks added (above 0) or saved (below 0) against the preferred model."""
        return None if self.on_preferred is None else self.cost - self.on_preferred


def cost_figures(rows: Sequence[SpendRow], preferred: tuple[str, Prices | None] | None) -> CostFigures | None:
    """A job's spend (the store's :data:`capmon.audit.SPEND_SQL` rows); ``preferred``: the
    model every item counted on first and its prices. None when no answer told its usage."""
    if not rows:
        return None
    prices = preferred[1] if preferred is not None else None
    models = []
    for model, answers, priced, cost, tokens_in, cached, out in rows:
        # Prices are linear in each count: the sums priced once are the answers priced one by one.
        again = cost_of(prices, Tokens(tokens_in, cached, out)) if priced else (0.0 if prices is not None else None)
        models.append(CostRow(model or "?", answers, priced, cost, again))
    models.sort(key=lambda m: -m.cost)
    on_preferred = None if prices is None else sum(m.on_preferred or 0.0 for m in models)
    return CostFigures(
        preferred=preferred[0] if preferred is not None else None,
        models=tuple(models),
        cost=sum(m.cost for m in models),
        on_preferred=on_preferred,
        unpriced=sum(m.answers - m.priced for m in models),
    )


@dataclass(frozen=True)
class JobReport:
    job: str
    state: str
    input_path: str | None
    settings: dict[str, Any]
    total: int
    done: int
    failed: int
    parked: int
    pending: int
    attempts: int
    models: tuple[ModelRow, ...]
    by_status: dict[str, int]
    by_kind: dict[str, int]
    fell_back_items: int
    fallback_pairs: tuple[tuple[str, str, int], ...]
    parks: int
    parks_by_kind: dict[str, int]
    failures: dict[str, int]
    failed_samples: tuple[tuple[int, str, str, str], ...]
    keys: tuple[KeyRow, ...]
    tokens: TokenFigures
    removed: int  # items whose line left the input (--accept-changed-input)
    active_seconds: int  # seconds in which at least one attempt started (gaps between runs left out)
    first_attempt: float | None
    last_attempt: float | None
    continued_items: int = 0  # items whose streamed answer broke mid-way and was continued
    cost: CostFigures | None = None  # None: no answer told its usage
    agreement: Agreement | None = None  # capmon batch compare's; None: never compared
    agreement_by_model: dict[str, Agreement] = field(default_factory=dict)  # by the fallback model that served

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.cost is not None:
            d["cost"]["gap"] = self.cost.gap
        d["agreement"] = None if self.agreement is None else self.agreement.as_dict()
        d["agreement_by_model"] = {m: a.as_dict() for m, a in self.agreement_by_model.items()}
        d["fallback_pairs"] = [{"from": a, "to": b, "count": n} for a, b, n in self.fallback_pairs]
        d["failed_samples"] = [
            {"line": line, "id": i, "kind": k, "message": m} for line, i, k, m in self.failed_samples
        ]
        return d


@dataclass(frozen=True)
class ItemReport:
    job: str
    item: str
    line: int | None
    state: str
    model: str | None
    fell_back: bool
    error: str | None
    attempts: tuple[AuditRow, ...]
    why: tuple[str, ...]
    replaced: tuple[dict[str, Any], ...] = ()  # earlier results of a line that changed, oldest first
    first_model: str | None = None  # the model it counted on first: what a fallback fell back from

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["attempts"] = [asdict(a) for a in self.attempts]
        return d


def settings_text(s: dict[str, Any]) -> str:
    """A job's settings in one phrase, as `capmon report` and `capmon batch show` print them."""
    remap = ", ".join(f"{shown(k)}={shown(v)}" for k, v in (s.get("remap") or {}).items())
    return (
        f"concurrency {s.get('concurrency', '-')}, rate {s.get('rate') or '-'}/s, window {s.get('window') or '-'}"
        + (f", remap {remap}" if remap else "")
    )


def _status_key(status: int | None) -> str:
    return "none" if status is None else str(status)


def fmt_seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


# ---------------------------------------------------------------- a job


@dataclass
class _Tally:
    """One model's attempts, as they are counted."""

    attempts: int = 0
    ok: int = 0
    by_status: collections.Counter[str] = field(default_factory=collections.Counter)
    by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    fallbacks: int = 0


def build_report(
    store: Store, job: str, items_shown: int = ITEMS_SHOWN_DATA, preferred: tuple[str, Prices | None] | None = None
) -> JobReport:
    """``preferred``: the model the job's items counted on first (the config's first) and its
    prices, for what the job would have cost without its fallbacks."""
    info = store.job(job)
    if info is None and not store.has_attempts(job):
        store.require(job)  # raises, naming the jobs there are

    # Attempts, grouped.
    per_model: dict[str, _Tally] = {}
    by_status: collections.Counter[str] = collections.Counter()
    by_kind: collections.Counter[str] = collections.Counter()
    keys: dict[tuple[str, str], list[int]] = {}
    parks = 0
    parks_by_kind: collections.Counter[str] = collections.Counter()
    total_attempts = 0
    for model, status, kind, decision, key_alias, endpoint, n in store.attempt_groups(job):
        if decision == RunnerDecision.PARK:
            parks += n
            parks_by_kind[kind or "?"] += n
            continue
        if decision in RUNNER_DECISIONS or decision == Decision.SKIP:
            continue  # not attempts of the client: nothing was sent
        total_attempts += n
        m = per_model.setdefault(model or "?", _Tally())
        m.attempts += n
        if kind is None:
            m.ok += n
        else:
            m.by_status[_status_key(status)] += n
            m.by_kind[kind] += n
            by_status[_status_key(status)] += n
            by_kind[kind] += n
        if decision == Decision.FALLBACK:
            m.fallbacks += n
        k = keys.setdefault((key_alias or "?", endpoint or "?"), [0, 0, 0])
        k[0] += n
        if kind == Kind.AUTH or status in (401, 403):
            k[1] += n
        if kind == Kind.QUOTA:
            k[2] += n

    latencies: dict[str, list[float]] = collections.defaultdict(list)
    for model, latency in store.ok_latencies(job):
        latencies[model or "?"].append(float(latency))

    # Fallback pairs: consecutive attempts of one item on different models.
    pairs: collections.Counter[tuple[str, str]] = collections.Counter()
    last_item, last_model = None, None
    for item, model in store.attempt_models(job):
        if item == last_item and model != last_model and last_model is not None and model is not None:
            pairs[(last_model, model)] += 1
        last_item, last_model = item, model
    first, last, active = store.attempt_span(job)
    apis = store.attempt_apis(job)

    # Items.
    served: dict[str, int] = {}
    items_of: dict[str, list[str]] = collections.defaultdict(list)
    counts = {s: 0 for s in ItemState}
    failures: dict[str, int] = {}
    samples: list[tuple[int, str, str, str]] = []
    fell_back = 0
    tokens = TokenFigures(0, None, None, None, None, None)
    agreed: Agreement | None = None
    agreed_by_model: dict[str, Agreement] = {}
    state = "unknown"
    total = 0
    if info is not None:
        counts.update(store.counts(info.id))
        served = store.served_by_model(info.id)
        failures = store.failure_kinds(info.id)
        samples = store.failed_items(info.id, 10)
        for model, item_id in store.served_items(info.id, items_shown):
            items_of[str(model)].append(item_id)
        fell_back = store.fell_back_count(info.id)
        agreed, agreed_by_model = job_agreement(store, info.id)
        tokens = _tokens(store.token_use(info.id))
        state = store.state_of(info)
        total = info.total
    else:
        # Attempts without a job row (a program that set Request.job itself).
        served = store.answered_items(job)
        counts[ItemState.DONE] = total = sum(served.values())

    models: list[ModelRow] = []
    for name in dict.fromkeys([*served, *per_model]):
        m = per_model.get(name) or _Tally()
        lat = sorted(latencies.get(name, []))
        n_served = served.get(name, 0)
        listed = tuple(items_of.get(name, ()))
        models.append(
            ModelRow(
                model=name,
                served=n_served,
                attempts=m.attempts,
                ok=m.ok,
                status_429=m.by_status.get("429", 0),
                status_503=m.by_status.get("503", 0) + m.by_status.get("529", 0),
                by_status=dict(m.by_status.most_common()),
                by_kind=dict(m.by_kind.most_common()),
                fallbacks_from=m.fallbacks,
                mean_latency=sum(lat) / len(lat) if lat else None,
                p99_latency=percentile(lat, 0.99),
                items=listed,
                apis=apis.get(name, ()),
            )
        )
    models.sort(key=lambda r: -r.served)
    return JobReport(
        job=job,
        state=state,
        input_path=info.input_path if info else None,
        settings=info.settings if info else {},
        total=total,
        done=counts[ItemState.DONE],
        failed=counts[ItemState.FAILED],
        parked=counts[ItemState.PARKED],
        pending=counts[ItemState.PENDING] + counts[ItemState.IN_FLIGHT],
        attempts=total_attempts,
        models=tuple(models),
        by_status=dict(by_status.most_common()),
        by_kind=dict(by_kind.most_common()),
        fell_back_items=fell_back,
        fallback_pairs=tuple((a, b, n) for (a, b), n in pairs.most_common()),
        parks=parks,
        parks_by_kind=dict(parks_by_kind),
        failures=failures,
        failed_samples=tuple(samples),
        keys=tuple(KeyRow(alias, ep, v[0], v[1], v[2]) for (alias, ep), v in sorted(keys.items())),
        tokens=tokens,
        removed=counts[ItemState.REMOVED],
        active_seconds=active,
        continued_items=store.continued_items(job),
        cost=cost_figures(store.spend(job), preferred),
        agreement=agreed,
        agreement_by_model=agreed_by_model,
        first_attempt=first,
        last_attempt=last,
    )


def _tokens(use: list[tuple[int, int]]) -> TokenFigures:
    if not use:
        return TokenFigures(0, None, None, None, None, None)
    requested = sorted(r for r, _ in use)
    used = sorted(u for _, u in use)
    return TokenFigures(
        items=len(used),
        requested_median=requested[len(requested) // 2],
        used_median=used[len(used) // 2],
        used_p95=_int(percentile(used, 0.95)),
        used_p99=_int(percentile(used, 0.99)),
        used_max=used[-1],
    )


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


# ---------------------------------------------------------------- one item


def _at(a: AuditRow, attempts: Sequence[AuditRow]) -> str:
    """Which deployment of its model ``a`` went to (`` at west as sim-m-west``), when the
    item's record has that model at more than one endpoint; "" otherwise."""
    if len({b.endpoint for b in attempts if b.model == a.model and b.endpoint}) < 2:
        return ""
    named = f" as {shown(a.deployment)}" if a.deployment and a.deployment != a.model else ""
    return f" at {shown(a.endpoint or '-')}{named}"


def explain(attempts: Sequence[AuditRow]) -> tuple[str, ...]:
    """One sentence per attempt that was not the answer: what happened and what came next."""
    out = []
    for i, a in enumerate(attempts):
        on = f"{shown(a.model)}{_at(a, attempts)}"
        what = f"attempt {a.attempt} on {on}: {a.status or 'no response'} {shown(a.kind or '')}".rstrip()
        reason = f" ({shown(a.reason)})" if a.reason else ""
        nxt = next((b for b in attempts[i + 1 :] if b.decision not in RUNNER_DECISIONS), None)
        if a.decision == Decision.FALLBACK:
            to = shown(nxt.model) if nxt else "another model"
            out.append(
                f"{what}{reason}: fell back to {to}" + (", which had room" if a.kind == Kind.CAPACITY else "") + "."
            )
        elif a.decision == Decision.RETRY:
            out.append(
                f"{what}{reason}: retried "
                + (f"the same model{_at(nxt, attempts)} " if nxt and nxt.model == a.model else "")
                + f"after {a.wait or 0:.1f}s"
                + (f" (server hint {a.hint:.1f}s)" if a.hint else "")
                + "."
            )
        elif a.decision == RunnerDecision.PARK:
            out.append(
                f"parked by the runner for {a.wait or 0:.0f}s after {shown(a.kind)}: no model could take it then."
            )
        elif a.decision == Decision.FAIL:
            out.append(f"{what}{reason}: failed, retrying cannot help.")
        elif a.decision == Decision.CONTINUE:
            to = shown(nxt.model) if nxt else "another attempt"
            out.append(f"{what}{reason} after part of the answer: continued by {to}.")
        elif a.decision == Decision.OK:
            out.append(f"answered by {on} in {fmt_seconds(a.latency)}.")
        elif a.decision == Decision.SKIP:
            out.append(f"passed over {shown(a.model)} ({shown(a.endpoint or '-')}){reason}.")
        elif a.decision == RunnerDecision.REFUSE:
            out.append(f"refused by the runner: {shown(a.reason)}.")
        elif a.decision in (RunnerDecision.SUPERSEDED, RunnerDecision.REMOVED):
            out.append(f"{shown(a.reason)}.")
    return tuple(out)


def build_item_report(store: Store, job: str, item_id: str) -> ItemReport:
    info = store.job(job)
    row = store.item(info.id, item_id) if info is not None else None
    attempts = tuple(store.attempts(job, item_id))
    if row is None and not attempts:
        if info is None:
            store.require(job)
        raise BatchError(f"job {job!r} has no item {item_id!r}")
    error = None
    if row and row.get("state") == ItemState.FAILED:
        error = f"{row.get('error_kind')}: {row.get('error_message')}"
    return ItemReport(
        job=job,
        item=item_id,
        line=row.get("line") if row else None,
        state=row.get("state", "?") if row else "?",
        model=row.get("model") if row else None,
        fell_back=bool(row.get("fell_back")) if row else False,
        error=error,
        attempts=attempts,
        why=explain(attempts),
        replaced=store.replaced_results(job, item_id),
        first_model=row.get("first_model") if row else None,
    )
