"""`capmon report JOB`: what happened in a job, from its items and its audit trail.

Items served per model, 429 / 503 counts by status, fallbacks, mean and p99 latency,
what the answers cost per model beside what they would have cost on the preferred model
(the config's first, at its prices, with each answer's own tokens: the gap is what the
fallbacks saved or added), which items each model served (truncated), and with an item
every attempt of it and why it fell back. JSON and CSV for machines; advice says what to change (see
:mod:`capmon.advice`). The figures come from :mod:`capmon.batch.figures`.

Ids come from the user's file and messages from a provider: in text output anything
that would not print as itself (a newline, a terminal escape) is shown as ``repr``
shows it (:func:`shown`); JSON and CSV keep the data as it is.
"""

from __future__ import annotations

import csv
import enum
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from capmon import audit
from capmon.advice import Advice, advise
from capmon.batch.compare import Agreement
from capmon.batch.figures import (
    CostFigures,
    ItemReport,
    JobReport,
    build_item_report,
    build_report,
    explain,
    fmt_seconds,
    settings_text,
    shown,
)
from capmon.batch.states import ItemState
from capmon.batch.store import Db, locate, open_store
from capmon.core.base import text
from capmon.core.types.config import find_config, load_config
from capmon.core.types.prices import Prices, price_of
from capmon.exitcodes import EXIT_OK

__all__ = [
    "ItemReport",
    "JobReport",
    "OutputFormat",
    "ReportOptions",
    "build_item_report",
    "build_report",
    "explain",
    "format_item",
    "format_report",
    "run_report",
    "shown",
    "write_csv",
    "write_item_csv",
]

ITEMS_SHOWN_TEXT = 10


class OutputFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"
    CSV = "csv"


@dataclass(frozen=True)
class ReportOptions:
    job: str
    db: Db | None = None  # None: $CAPMON_DB or the user data dir
    format: OutputFormat = OutputFormat.TEXT
    advice: bool = False  # say what to change (text and JSON)
    item: str | None = None  # one item: every attempt, and why
    config: str | None = None  # the config (its first model is the preferred one); None: found as usual


# ---------------------------------------------------------------- text


def _when(wall: float | None) -> str:
    return text.timestamp(wall, date=True)


def format_report(r: JobReport, items_shown: int = ITEMS_SHOWN_TEXT, advice: Sequence[Advice] = ()) -> str:
    lines = [
        f"job {shown(r.job)}: {r.total} items, {r.done} done, {r.failed} failed, {r.parked} parked, {r.pending} pending"
        + (f", {r.removed} removed from the input" if r.removed else "")
        + f" ({r.state})",
        f"settings: {settings_text(r.settings)}; "
        f"{r.attempts} attempts from {_when(r.first_attempt)} to {_when(r.last_attempt)}",
        "",
    ]
    rows = [
        ("model", "api", "served", "share", "attempts", "429", "503", "other errors", "fell back from", "mean", "p99")
    ]
    for m in r.models:
        other = sum(m.by_kind.values()) - m.status_429 - m.status_503
        rows.append(
            (
                shown(m.model),
                ", ".join(m.apis) or "-",
                str(m.served),
                f"{m.served / r.done:.0%}" if r.done else "-",
                str(m.attempts),
                str(m.status_429),
                str(m.status_503),
                str(max(0, other)),
                str(m.fallbacks_from),
                fmt_seconds(m.mean_latency),
                fmt_seconds(m.p99_latency),
            )
        )
    lines += text.table(rows) if r.models else ["no attempts recorded"]
    lines.append("")
    statuses = ", ".join(f"{k} x{n}" for k, n in r.by_status.items()) or "none"
    lines.append(f"errors by status: {statuses}")
    if r.by_kind:
        lines.append("errors by kind: " + ", ".join(f"{shown(k)} {n}" for k, n in r.by_kind.items()))
    pairs = ", ".join(f"{shown(a)} -> {shown(b)} {n}" for a, b, n in r.fallback_pairs)
    lines.append(
        # Items whose first choice served them not, tried or skipped (its breaker open); the
        # pairs are the moves between attempts the audit holds.
        f"fallbacks: {r.fell_back_items} items served by another model than their first choice"
        + (f" (moves between attempts: {pairs})" if pairs else "")
    )
    if r.agreement is not None:
        lines.append(_agreement_line(r.agreement, r.agreement_by_model))
    if r.cost is not None:
        lines += _cost_lines(r.cost)
    if r.continued_items:
        lines.append(
            f"continued: {r.continued_items} items whose answer broke mid-stream were finished by a continuation"
        )
    if r.parks:
        lines.append(
            f"parked: {r.parks} times (" + ", ".join(f"{shown(k)} {n}" for k, n in r.parks_by_kind.items()) + ")"
        )
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
    if advice:
        lines.append("")
        lines.append("advice:")
        for i, a in enumerate(advice, 1):
            lines.append(f"  {i}. {shown(a.text)}")
    return "\n".join(lines)


def _cost_lines(c: CostFigures) -> list[str]:
    priced = sum(m.priced for m in c.models)
    head = f"cost: {text.usd(c.cost)} for {priced} answers"
    if c.unpriced:
        head += f" ({c.unpriced} more without a price: set [[models]] prices)"
    gap = c.gap
    if c.preferred is not None and gap is not None:
        said = "added" if gap > 0 else "saved"
        head += f"; on {shown(c.preferred)}, the preferred model, {text.usd(c.on_preferred)}"
        head += f": the fallbacks {said} {text.usd(abs(gap))}" if gap else ": the fallbacks changed nothing"
    elif c.preferred is not None:
        head += f"; {shown(c.preferred)}, the preferred model, has no price to compare with"
    on = f"on {shown(c.preferred)}" if c.preferred is not None else "on the preferred"
    rows = [("model", "answers", "priced", "cost", on)]
    for m in c.models:
        rows.append((shown(m.model), str(m.answers), str(m.priced), text.usd(m.cost), text.usd(m.on_preferred)))
    return [head, *(f"  {line}" for line in text.table(rows))]


def format_item(r: ItemReport) -> str:
    head = f"item {shown(r.item)}" + (f" (line {r.line})" if r.line else "") + f" of job {shown(r.job)}: {r.state}"
    if r.model:
        head += f", served by {shown(r.model)}"
    if r.fell_back:
        head += (
            f", fell back from {shown(r.first_model)}" if r.first_model and r.first_model != r.model else ", fell back"
        )
    lines = [head]
    if r.error:
        lines.append(f"error: {shown(r.error)}")
    rows = [
        (
            "#",
            "time",
            "model",
            "endpoint",
            "api",
            "key",
            "status",
            "kind",
            "hint",
            "wait",
            "latency",
            "decision",
            "reason",
        )
    ]
    for a in r.attempts:
        rows.append(
            (
                str(a.attempt),
                text.timestamp(a.at, precision="ms"),
                shown(a.model or "-"),
                shown(a.endpoint or "-"),
                shown(a.api or "-"),
                shown(a.key_alias or "-"),
                str(a.status or "-"),
                shown(a.kind or "-"),
                "-" if a.hint is None else f"{a.hint:.1f}s",
                "-" if not a.wait else f"{a.wait:.1f}s",
                fmt_seconds(a.latency),
                shown(a.decision),
                shown((a.reason or "")[:80]),
            )
        )
    lines.append("")
    lines += text.table(rows) if r.attempts else ["no attempts recorded (nothing was sent for it)"]
    if r.why:
        lines.append("")
        lines.append("why:")
        lines += [f"  {w}" for w in r.why]
    if r.replaced:
        lines.append("")
        lines.append("earlier results (replaced when the line changed):")
        for old in r.replaced:
            what = (
                f"done by {shown(old['model'])}: {shown((old['content'] or '')[:60])}"
                if old["state"] == ItemState.DONE
                else f"{old['state']}: {shown(old['error_kind'])}: {shown(old['error_message'])}"
            )
            lines.append(f"  line {old['line']}, replaced {_when(old['at'])} ({shown(old['why'])}): {what}")
    return "\n".join(lines)


# ---------------------------------------------------------------- csv


def write_csv(r: JobReport, out: TextIO) -> None:
    w = csv.writer(out)
    w.writerow(
        [
            "model",
            "api",
            "served",
            "attempts",
            "ok",
            "status_429",
            "status_503",
            "errors",
            "fallbacks_from",
            "mean_latency",
            "p99_latency",
            "items",
            "cost_usd",
            "on_preferred_usd",
            "compared",
            "agreed",
        ]
    )
    costs = {c.model: c for c in r.cost.models} if r.cost is not None else {}
    for m in r.models:
        c = costs.get(m.model)
        w.writerow(
            [
                m.model,
                " ".join(m.apis),
                m.served,
                m.attempts,
                m.ok,
                m.status_429,
                m.status_503,
                sum(m.by_kind.values()),
                m.fallbacks_from,
                "" if m.mean_latency is None else f"{m.mean_latency:.4f}",
                "" if m.p99_latency is None else f"{m.p99_latency:.4f}",
                " ".join(m.items),
                "" if c is None else c.cost,
                "" if c is None or c.on_preferred is None else c.on_preferred,
                "" if (a := r.agreement_by_model.get(m.model)) is None else a.compared,
                "" if a is None else a.agreed,
            ]
        )


def _agreement_line(a: Agreement, by_model: dict[str, Agreement]) -> str:
    """capmon batch compare's: how often the preferred model gave the fallback's answer."""
    if a.rate is None:
        head = f"agreement: none of {a.missing} comparisons got an answer"
    else:
        head = f"agreement: {a.rate:.0%} ({a.agreed} of {a.compared} items compared, the preferred model's answer"
        head += " the same as the fallback's"
        head += f"; {a.missing} got no answer)" if a.missing else ")"
    if len(by_model) > 1:
        head += "; by fallback: " + ", ".join(
            f"{shown(m)} {b.agreed}/{b.compared}" for m, b in by_model.items() if b.compared
        )
    return head


def write_item_csv(r: ItemReport, out: TextIO) -> None:
    w = csv.writer(out)
    w.writerow(audit.COLUMNS)
    for a in r.attempts:
        w.writerow([getattr(a, c) if getattr(a, c) is not None else "" for c in audit.COLUMNS])


# ---------------------------------------------------------------- command


class _Output(Protocol):
    """What the command writes, in each format."""

    def data(self) -> dict[str, Any]: ...

    def write_csv(self, out: TextIO) -> None: ...

    def text(self) -> str: ...


@dataclass(frozen=True)
class _JobOutput:
    report: JobReport
    advice: tuple[Advice, ...] = ()

    def data(self) -> dict[str, Any]:
        return {**self.report.to_dict(), "advice": [a.to_dict() for a in self.advice]}

    def write_csv(self, out: TextIO) -> None:
        write_csv(self.report, out)

    def text(self) -> str:
        return format_report(self.report, advice=self.advice)


@dataclass(frozen=True)
class _ItemOutput:
    report: ItemReport

    def data(self) -> dict[str, Any]:
        return self.report.to_dict()

    def write_csv(self, out: TextIO) -> None:
        write_item_csv(self.report, out)

    def text(self) -> str:
        return format_item(self.report)


def _write(output: _Output, fmt: OutputFormat, out: TextIO) -> None:
    if fmt is OutputFormat.JSON:
        json.dump(output.data(), out, indent=2, default=str)
        out.write("\n")
    elif fmt is OutputFormat.CSV:
        output.write_csv(out)
    else:
        out.write(output.text() + "\n")


def preferred(config: str | None) -> tuple[str, Prices | None]:
    """The config's first model and its prices where it is tried first (its first deployment's)."""
    cfg = load_config(find_config(config))
    first = cfg.models[0]
    deployment = first.deployed()[0]
    return first.name, price_of(first.at(deployment), cfg.endpoint(deployment.endpoint).api)


def run_report(options: ReportOptions, out: TextIO | None = None) -> int:
    """`capmon report JOB [--item ID] [--advice] [--json | --csv]`."""
    store = open_store(options.db if options.db is not None else locate(), readonly=True)
    try:
        output: _Output
        if options.item is not None:
            output = _ItemOutput(build_item_report(store, options.job, options.item))
        else:
            report = build_report(store, options.job, preferred=preferred(options.config))
            output = _JobOutput(report, tuple(advise(report)) if options.advice else ())
    finally:
        store.close()
    _write(output, options.format, out or sys.stdout)
    return EXIT_OK
