"""`capmon report JOB`: what happened in a job, from its items and its audit trail.

Items served per model, 429 / 503 counts by status, fallbacks, mean and p99 latency,
which items each model served (truncated), and with ``--item ID`` every attempt of
one item and why it fell back. ``--json`` and ``--csv`` for machines; ``--advice``
says what to change (see :mod:`capmon.advice`).

Ids come from the user's file and messages from a provider: in text output anything
that would not print as itself (a newline, a terminal escape) is shown as ``repr``
shows it (:func:`shown`); JSON and CSV keep the data as it is.
"""

from __future__ import annotations

import argparse
import collections
import csv
import datetime as dt
import json
import math
import sqlite3
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence, TextIO

from capmon import audit
from capmon.batch.store import JobStore, default_db_path, job_state
from capmon.core.clock import default_clock
from capmon.core.exceptions import BatchError

ITEMS_SHOWN_TEXT = 10
ITEMS_SHOWN_DATA = 100
# Decisions that are the runner's, not attempts of the client: left out of attempt counts.
_NOT_ATTEMPTS = "(" + ", ".join(repr(d) for d in audit.RUNNER_DECISIONS) + ")"


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
    items_more: int


@dataclass(frozen=True)
class TokenFigures:
    items: int  # done items with both figures
    requested_median: int | None  # max_tokens sent
    requested_max: int | None
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
    advice: tuple[Any, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fallback_pairs"] = [{"from": a, "to": b, "count": n} for a, b, n in self.fallback_pairs]
        d["failed_samples"] = [{"line": line, "id": i, "kind": k, "message": m} for line, i, k, m in self.failed_samples]
        d["advice"] = [a.to_dict() for a in self.advice]
        return d


def _percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _status_key(status: int | None) -> str:
    return "none" if status is None else str(status)


# ---------------------------------------------------------------- building


def build_report(store: JobStore, job: str, items_shown: int = ITEMS_SHOWN_DATA) -> JobReport:
    conn = store.conn
    info = store.job(job)
    has_attempts = conn.execute("SELECT 1 FROM attempts WHERE job = ? LIMIT 1", (job,)).fetchone() is not None
    if info is None and not has_attempts:
        store.require(job)  # raises, naming the jobs there are

    # Attempts, grouped.
    per_model: dict[str, dict[str, Any]] = {}
    by_status: collections.Counter[str] = collections.Counter()
    by_kind: collections.Counter[str] = collections.Counter()
    keys: dict[tuple[str, str], list[int]] = {}
    parks = 0
    parks_by_kind: collections.Counter[str] = collections.Counter()
    total_attempts = 0
    for model, status, kind, decision, key_alias, endpoint, n in conn.execute(
            "SELECT model, status, kind, decision, key_alias, endpoint, count(*) FROM attempts WHERE job = ? "
            "GROUP BY 1, 2, 3, 4, 5, 6", (job,)):
        if decision == audit.PARK:
            parks += n
            parks_by_kind[kind or "?"] += n
            continue
        if decision in audit.RUNNER_DECISIONS:
            continue
        total_attempts += n
        m = per_model.setdefault(model or "?", {"attempts": 0, "ok": 0, "by_status": collections.Counter(),
                                                "by_kind": collections.Counter(), "fallbacks": 0})
        m["attempts"] += n
        if kind is None:
            m["ok"] += n
        else:
            m["by_status"][_status_key(status)] += n
            m["by_kind"][kind] += n
            by_status[_status_key(status)] += n
            by_kind[kind] += n
        if decision == "fallback":
            m["fallbacks"] += n
        k = keys.setdefault((key_alias or "?", endpoint or "?"), [0, 0, 0])
        k[0] += n
        if kind == "auth" or status in (401, 403):
            k[1] += n
        if kind == "quota":
            k[2] += n

    latencies: dict[str, list[float]] = collections.defaultdict(list)
    for model, latency in conn.execute("SELECT model, latency FROM attempts WHERE job = ? AND decision = 'ok' "
                                       "AND latency IS NOT NULL", (job,)):
        latencies[model or "?"].append(float(latency))

    # Fallback pairs: consecutive attempts of one item on different models.
    pairs: collections.Counter[tuple[str, str]] = collections.Counter()
    last_item, last_model = None, None
    for item, model in conn.execute(f"SELECT item, model FROM attempts WHERE job = ? AND decision NOT IN "
                                    f"{_NOT_ATTEMPTS} ORDER BY item, rowid", (job,)):
        if item == last_item and model != last_model and last_model is not None and model is not None:
            pairs[(last_model, model)] += 1
        last_item, last_model = item, model

    first, last, active = conn.execute(
        "SELECT min(at), max(at), count(DISTINCT CAST(at AS INTEGER)) FROM attempts WHERE job = ? "
        f"AND decision NOT IN {_NOT_ATTEMPTS}", (job,)).fetchone()

    # Items.
    served: dict[str, int] = {}
    items_of: dict[str, list[str]] = collections.defaultdict(list)
    counts = {"done": 0, "failed": 0, "parked": 0, "pending": 0, "in_flight": 0, "removed": 0}
    failures: dict[str, int] = {}
    samples: list[tuple[int, str, str, str]] = []
    fell_back = 0
    tokens = TokenFigures(0, None, None, None, None, None, None)
    state = "unknown"
    total = 0
    if info is not None:
        counts.update(store.counts(info.id))
        served = store.served_by_model(info.id)
        failures = store.failure_kinds(info.id)
        samples = [tuple(r) for r in store.failed_items(info.id, 10)]  # type: ignore[misc]
        for model, item_id in conn.execute(
                "SELECT model, id FROM (SELECT model, id, row_number() OVER (PARTITION BY model ORDER BY key) AS n "
                "FROM items WHERE job_id = ? AND state = 'done') WHERE n <= ?", (info.id, items_shown)):
            items_of[str(model)].append(item_id)
        fell_back = int(conn.execute("SELECT count(*) FROM items WHERE job_id = ? AND state = 'done' AND fell_back = 1",
                                     (info.id,)).fetchone()[0])
        requested, used = [], []
        for max_tokens, completion in conn.execute(
                "SELECT max_tokens, completion_tokens FROM items WHERE job_id = ? AND state = 'done' "
                "AND max_tokens IS NOT NULL AND completion_tokens IS NOT NULL", (info.id,)):
            requested.append(int(max_tokens))
            used.append(int(completion))
        if used:
            requested.sort()
            used.sort()
            tokens = TokenFigures(len(used), requested[len(requested) // 2], requested[-1], used[len(used) // 2],
                                  _percentile(used, 0.95), _percentile(used, 0.99), used[-1])  # type: ignore[arg-type]
        state = job_state(info, default_clock().wall())
        total = info.total
    else:
        # Attempts without a job row (a program that set ChatRequest.job itself).
        for model, n in conn.execute("SELECT model, count(DISTINCT item) FROM attempts WHERE job = ? AND decision = 'ok' "
                                     "GROUP BY model", (job,)):
            served[str(model)] = int(n)
        counts["done"] = total = sum(served.values())

    models: list[ModelRow] = []
    names = list(dict.fromkeys([*served, *per_model]))
    for name in names:
        m = per_model.get(name, {"attempts": 0, "ok": 0, "by_status": collections.Counter(),
                                 "by_kind": collections.Counter(), "fallbacks": 0})
        lat = sorted(latencies.get(name, []))
        n_served = served.get(name, 0)
        shown = tuple(items_of.get(name, ()))
        models.append(ModelRow(
            model=name, served=n_served, attempts=m["attempts"], ok=m["ok"],
            status_429=m["by_status"].get("429", 0), status_503=m["by_status"].get("503", 0) + m["by_status"].get("529", 0),
            by_status=dict(m["by_status"].most_common()), by_kind=dict(m["by_kind"].most_common()),
            fallbacks_from=m["fallbacks"], mean_latency=sum(lat) / len(lat) if lat else None,
            p99_latency=_percentile(lat, 0.99), items=shown, items_more=max(0, n_served - len(shown)),
        ))
    models.sort(key=lambda r: -r.served)
    return JobReport(
        job=job, state=state, input_path=info.input_path if info else None, settings=info.settings if info else {},
        total=total, done=counts["done"], failed=counts["failed"], parked=counts["parked"],
        pending=counts["pending"] + counts["in_flight"], attempts=total_attempts, models=tuple(models),
        by_status=dict(by_status.most_common()), by_kind=dict(by_kind.most_common()), fell_back_items=fell_back,
        fallback_pairs=tuple((a, b, n) for (a, b), n in pairs.most_common()), parks=parks,
        parks_by_kind=dict(parks_by_kind), failures=failures, failed_samples=tuple(samples),
        keys=tuple(KeyRow(alias, ep, v[0], v[1], v[2]) for (alias, ep), v in sorted(keys.items())),
        tokens=tokens, removed=counts["removed"], active_seconds=int(active or 0), first_attempt=first,
        last_attempt=last,
    )


# ---------------------------------------------------------------- one item


@dataclass(frozen=True)
class ItemReport:
    job: str
    item: str
    line: int | None
    state: str
    model: str | None
    fell_back: bool
    error: str | None
    attempts: tuple[audit.AuditRow, ...]
    why: tuple[str, ...]
    replaced: tuple[dict[str, Any], ...] = ()  # earlier results of a line that changed, oldest first

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["attempts"] = [asdict(a) for a in self.attempts]
        return d


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def explain(attempts: Sequence[audit.AuditRow]) -> tuple[str, ...]:
    """One sentence per attempt that was not the answer: what happened and what came next."""
    out = []
    for i, a in enumerate(attempts):
        what = f"attempt {a.attempt} on {shown(a.model)}: {a.status or 'no response'} {shown(a.kind or '')}".rstrip()
        reason = f" ({shown(a.reason)})" if a.reason else ""
        nxt = next((b for b in attempts[i + 1:] if b.decision not in audit.RUNNER_DECISIONS), None)
        if a.decision == "fallback":
            to = shown(nxt.model) if nxt else "another model"
            out.append(f"{what}{reason}: fell back to {to}"
                       + (", which had room" if a.kind == "capacity" else "") + ".")
        elif a.decision == "retry":
            out.append(f"{what}{reason}: retried {'the same model ' if nxt and nxt.model == a.model else ''}"
                       f"after {a.wait or 0:.1f}s" + (f" (server hint {a.hint:.1f}s)" if a.hint else "") + ".")
        elif a.decision == audit.PARK:
            out.append(f"parked by the runner for {a.wait or 0:.0f}s after {shown(a.kind)}: no model could take it then.")
        elif a.decision == "fail":
            out.append(f"{what}{reason}: failed, retrying cannot help.")
        elif a.decision == "ok":
            out.append(f"answered by {shown(a.model)} in {_fmt_s(a.latency)}.")
        elif a.decision == audit.REFUSE:
            out.append(f"refused by the runner: {shown(a.reason)}.")
        elif a.decision in (audit.SUPERSEDED, audit.REMOVED):
            out.append(f"{shown(a.reason)}.")
    return tuple(out)


def build_item_report(store: JobStore, job: str, item_id: str) -> ItemReport:
    info = store.job(job)
    row = store.item(info.id, item_id) if info is not None else None
    attempts = tuple(audit.read_attempts(store.conn, job, item_id))
    if row is None and not attempts:
        if info is None:
            store.require(job)
        raise BatchError(f"job {job!r} has no item {item_id!r}")
    error = None
    if row and row.get("state") == "failed":
        error = f"{row.get('error_kind')}: {row.get('error_message')}"
    return ItemReport(
        job=job, item=item_id, line=row.get("line") if row else None, state=row.get("state", "?") if row else "?",
        model=row.get("model") if row else None, fell_back=bool(row.get("fell_back")) if row else False, error=error,
        attempts=attempts, why=explain(attempts), replaced=_replaced(store, job, item_id),
    )


def _replaced(store: JobStore, job: str, item_id: str) -> tuple[dict[str, Any], ...]:
    try:
        cur = store.conn.execute("SELECT line, at, why, state, model, content, error_kind, error_message FROM "
                                 "replaced_results WHERE job = ? AND item = ? ORDER BY rowid", (job, item_id))
    except sqlite3.OperationalError:  # a database from before the table existed
        return ()
    return tuple(dict(zip([d[0] for d in cur.description], r)) for r in cur)


# ---------------------------------------------------------------- text


def _when(wall: float | None) -> str:
    return "-" if wall is None else dt.datetime.fromtimestamp(wall).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def format_report(r: JobReport, items_shown: int = ITEMS_SHOWN_TEXT) -> str:
    s = r.settings
    lines = [
        f"job {shown(r.job)}: {r.total} items, {r.done} done, {r.failed} failed, {r.parked} parked, {r.pending} pending"
        + (f", {r.removed} removed from the input" if r.removed else "") + f" ({r.state})",
        f"settings: concurrency {s.get('concurrency', '-')}, rate {s.get('rate') or '-'}/s, window {s.get('window') or '-'}; "
        f"{r.attempts} attempts from {_when(r.first_attempt)} to {_when(r.last_attempt)}",
        "",
    ]
    rows = [("model", "served", "share", "attempts", "429", "503", "other errors", "fell back from", "mean", "p99")]
    for m in r.models:
        other = sum(m.by_kind.values()) - m.status_429 - m.status_503
        rows.append((shown(m.model), str(m.served), f"{m.served / r.done:.0%}" if r.done else "-", str(m.attempts),
                     str(m.status_429), str(m.status_503), str(max(0, other)), str(m.fallbacks_from),
                     _fmt_s(m.mean_latency), _fmt_s(m.p99_latency)))
    lines += _table(rows) if r.models else ["no attempts recorded"]
    lines.append("")
    statuses = ", ".join(f"{k} x{n}" for k, n in r.by_status.items()) or "none"
    lines.append(f"errors by status: {statuses}")
    if r.by_kind:
        lines.append("errors by kind: " + ", ".join(f"{shown(k)} {n}" for k, n in r.by_kind.items()))
    pairs = ", ".join(f"{shown(a)} -> {shown(b)} {n}" for a, b, n in r.fallback_pairs)
    lines.append(f"fallbacks: {r.fell_back_items} items served by another model than they first tried"
                 + (f" ({pairs})" if pairs else ""))
    if r.parks:
        lines.append(f"parked: {r.parks} times (" + ", ".join(f"{shown(k)} {n}" for k, n in r.parks_by_kind.items()) + ")")
    if r.failures:
        lines.append("failed items: " + ", ".join(f"{shown(k)} {n}" for k, n in r.failures.items()))
        for line, item_id, kind, message in r.failed_samples[:5]:
            lines.append(f"  line {line} ({shown(item_id)}): {shown(kind)}: {shown(message)}")
    if any(m.served for m in r.models):
        lines.append("")
        lines.append("items served, by model:")
        for m in r.models:
            if not m.served:
                continue
            ids = [shown(i) for i in m.items[:items_shown]]
            more = m.served - len(ids)
            lines.append(f"  {shown(m.model)}: {', '.join(ids)}" + (f" ... and {more} more" if more > 0 else ""))
    if r.advice:
        lines.append("")
        lines.append("advice:")
        for i, a in enumerate(r.advice, 1):
            lines.append(f"  {i}. {shown(a.text)}")
    return "\n".join(lines)


def format_item(r: ItemReport) -> str:
    head = f"item {shown(r.item)}" + (f" (line {r.line})" if r.line else "") + f" of job {shown(r.job)}: {r.state}"
    if r.model:
        head += f", served by {shown(r.model)}"
    if r.fell_back:
        head += ", fell back"
    lines = [head]
    if r.error:
        lines.append(f"error: {shown(r.error)}")
    rows = [("#", "time", "model", "endpoint", "key", "status", "kind", "hint", "wait", "latency", "decision", "reason")]
    for a in r.attempts:
        rows.append((str(a.attempt), dt.datetime.fromtimestamp(a.at).strftime("%H:%M:%S.%f")[:-3], shown(a.model or "-"),
                     shown(a.endpoint or "-"), shown(a.key_alias or "-"), str(a.status or "-"), shown(a.kind or "-"),
                     "-" if a.hint is None else f"{a.hint:.1f}s", "-" if not a.wait else f"{a.wait:.1f}s",
                     _fmt_s(a.latency), shown(a.decision), shown((a.reason or "")[:80])))
    lines.append("")
    lines += _table(rows) if r.attempts else ["no attempts recorded (nothing was sent for it)"]
    if r.why:
        lines.append("")
        lines.append("why:")
        lines += [f"  {w}" for w in r.why]
    if r.replaced:
        lines.append("")
        lines.append("earlier results (replaced when the line changed):")
        for old in r.replaced:
            what = (f"done by {shown(old['model'])}: {shown((old['content'] or '')[:60])}" if old["state"] == "done"
                    else f"{old['state']}: {shown(old['error_kind'])}: {shown(old['error_message'])}")
            lines.append(f"  line {old['line']}, replaced {_when(old['at'])} ({shown(old['why'])}): {what}")
    return "\n".join(lines)


# ---------------------------------------------------------------- csv


def write_csv(r: JobReport, out: TextIO) -> None:
    w = csv.writer(out)
    w.writerow(["model", "served", "attempts", "ok", "status_429", "status_503", "errors", "fallbacks_from",
                "mean_latency", "p99_latency", "items"])
    for m in r.models:
        w.writerow([m.model, m.served, m.attempts, m.ok, m.status_429, m.status_503, sum(m.by_kind.values()),
                    m.fallbacks_from, "" if m.mean_latency is None else f"{m.mean_latency:.4f}",
                    "" if m.p99_latency is None else f"{m.p99_latency:.4f}", " ".join(m.items)])


def write_item_csv(r: ItemReport, out: TextIO) -> None:
    w = csv.writer(out)
    w.writerow(audit.COLUMNS)
    for a in r.attempts:
        w.writerow([getattr(a, c) if getattr(a, c) is not None else "" for c in audit.COLUMNS])


# ---------------------------------------------------------------- command


def run_report(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    db = Path(args.db).expanduser() if getattr(args, "db", None) else default_db_path()
    store = JobStore(db, readonly=True)
    try:
        if getattr(args, "item", None):
            item = build_item_report(store, args.job, args.item)
            if args.json:
                json.dump(item.to_dict(), out, indent=2, default=str)
                out.write("\n")
            elif args.csv:
                write_item_csv(item, out)
            else:
                out.write(format_item(item) + "\n")
            return 0
        report = build_report(store, args.job)
    finally:
        store.close()
    if getattr(args, "advice", False):
        from capmon.advice import advise

        report = _with_advice(report, advise(report))
    if args.json:
        json.dump(report.to_dict(), out, indent=2, default=str)
        out.write("\n")
    elif args.csv:
        write_csv(report, out)
    else:
        out.write(format_report(report) + "\n")
    return 0


def _with_advice(report: JobReport, advice: Sequence[Any]) -> JobReport:
    from dataclasses import replace

    return replace(report, advice=tuple(advice))
