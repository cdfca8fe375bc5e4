"""Pure formatting: snapshot values -> short Rich Text for cells, panels and the log.

No widgets and no time here: every countdown is a deadline minus the snapshot's
``now``, so the same snapshot always renders the same text (snapshot tests rely
on it).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from capmon.core.base import text
from capmon.core.control.breaker import State
from capmon.core.control.seam import KeyState
from capmon.core.types import events as ev
from capmon.core.types.snapshot import TargetSnapshot


@dataclass(frozen=True)
class StateLook:
    glyph: str
    word: str
    style: str


# Colour, glyph AND word, so a state reads without colour too. Manual states use a
# hand and a reversed style so they never pass for something the breaker did.
STATES: dict[str, StateLook] = {  # by State; events carry the same values as plain strings
    State.CLOSED: StateLook("●", "closed", "green"),
    State.HALF_OPEN: StateLook("◐", "half-open", "bold yellow"),
    State.RAMP: StateLook("◑", "ramp", "cyan"),
    State.OPEN: StateLook("○", "open", "bold red"),
    State.FORCED_OPEN: StateLook("✋", "open (manual)", "bold white on red"),
    State.FORCED_CLOSED: StateLook("✋", "closed (manual)", "bold black on green"),
}
_UNKNOWN = StateLook("?", "?", "magenta")

SPARK_CHARS = "▁▂▃▄▅▆▇█"


def state_text(t: TargetSnapshot) -> Text:
    look = STATES.get(t.state, _UNKNOWN)
    word = look.word if look is not _UNKNOWN else t.state
    if t.state == State.RAMP and t.ramp_share is not None:
        word = f"ramp {t.ramp_share:.0%}"
    return Text(f"{look.glyph} {word}", style=look.style)


def breaker_cell(t: TargetSnapshot, now: float) -> Text:
    """The models table's breaker cell: the state, and what is next for it: the failures
    counting toward a trip while closed, the countdown to the next probe while open."""
    cell = state_text(t)
    if t.state == State.CLOSED and t.consecutive_failures:
        n = t.consecutive_failures
        cell.append(f", {n} fail{'s' if n != 1 else ''}", style="bold red")
    elif t.state != State.FORCED_OPEN and t.cooldown_until is not None and t.cooldown_until > now:
        cell.append(", probe ", style="dim")
        cell.append(text.countdown(t.cooldown_until - now), style="bold red")
    return cell


# The provider APIs in their own colours, so a change of provider reads at a glance.
API_STYLES: dict[str, str] = {"openai": "green", "anthropic": "magenta", "azure": "blue"}


def api_text(api: str) -> Text:
    return Text(api, style=API_STYLES.get(api, ""))


def latency(seconds: float | None) -> Text:
    return Text(text.latency(seconds), style="dim" if seconds is None else "")


def count(value: float, *, warn: str = "yellow") -> Text:
    """A per-minute count; zero is dim so that the non-zero ones stand out."""
    if value <= 0:
        return Text("0", style="dim")
    return Text(f"{value:.0f}", style=warn)


def error_share(share: float) -> Text:
    if share <= 0:
        return Text("0%", style="dim")
    style = "bold red" if share >= 0.5 else "yellow" if share >= 0.1 else ""
    return Text(f"{share:.0%}", style=style)


def spark(values: tuple[int, ...], top: int | None = None) -> Text:
    """Unicode blocks, one per value, scaled to ``top`` (default: the largest value)
    so that rows sharing a ``top`` can be compared by eye."""
    top = max(values, default=0) if top is None else top
    out = Text()
    for v in values:
        if v <= 0 or top <= 0:
            out.append(SPARK_CHARS[0], style="dim green")
        else:
            i = min(len(SPARK_CHARS) - 1, max(1, round(v / top * (len(SPARK_CHARS) - 1))))
            out.append(SPARK_CHARS[i], style="red" if i >= 5 else "yellow")
    return out


def key_text(t: TargetSnapshot, now: float) -> Text:
    if t.key_state == KeyState.DISABLED:
        return Text("disabled", style="bold white on red")
    if t.key_state == KeyState.PARKED:
        # One unit (42s, 59m, 3h): the column is narrow and the reset is rarely to the second.
        left = f" {text.duration(max(0.0, t.key_until - now), parts=1)}" if t.key_until is not None else ""
        return Text(f"parked{left}", style="bold yellow")
    return Text("ok", style="dim")


def last_status(t: TargetSnapshot) -> Text:
    if t.unreachable_reason:  # no status at all: the endpoint could not be connected to
        return Text("net", style="bold red")
    if t.last_status is None:
        return Text("-", style="dim")
    style = "green" if t.last_status < 300 else "yellow" if t.last_status == 429 else "red"
    return Text(str(t.last_status), style=style)


# ---------------------------------------------------------------- event log lines


def _why(line: Text, reason: str, width: int | None = 60) -> Text:
    """``line`` and, when there is one, the reason in brackets (on one line, clipped to ``width``)."""
    if reason:
        line.append(f" ({reason if width is None else text.shorten(reason, width)})", style="dim")
    return line


def breaker_line(e: ev.BreakerChanged) -> Text:
    look = STATES.get(e.new, _UNKNOWN)
    line = _why(Text.assemble((f"{look.glyph} {e.model}", look.style), f" breaker {e.old} → {e.new}"), e.reason, None)
    if e.new == State.OPEN and e.cooldown_until is not None:
        line.append(f", next probe in {text.countdown(e.cooldown_until - e.at)}", style="dim")
    return line


def probe_line(e: ev.ProbeFinished) -> Text:
    if e.ok:
        took = f" in {text.latency(e.latency)}" if e.latency is not None else ""
        return Text.assemble(
            (f"◌ {e.model}", "green"), f" probe answered{took}" + (": the ramp starts" if e.breaker else "")
        )
    line = _why(
        Text.assemble(
            (f"◌ {e.model}", "red" if e.ok is False else "dim"), f" probe {'failed' if e.ok is False else 'not sent'}"
        ),
        e.reason,
        50,
    )
    if e.next_probe_at is not None:
        line.append(f", next in {text.countdown(e.next_probe_at - e.at)}", style="dim")
    return line


def ramp_line(e: ev.RampStep) -> Text:
    return _why(Text.assemble((f"◑ {e.model}", "cyan"), f" ramp {e.share:.0%}"), e.reason, 50)


def token_param_line(e: ev.TokenParamLearned) -> Text:
    where = f" at {e.endpoint}" if e.endpoint else ""
    return _why(Text.assemble((f"⚙ {e.model}", "bold"), f"{where} sends {e.param} from now on"), e.reason)


def capability_line(e: ev.CapabilityLearned) -> Text:
    head = Text.assemble((f"⊘ {e.model}", "bold"), f" at {e.endpoint} has no {e.feature}: skipped when needed")
    return _why(head, e.reason)


def fallback_pair(from_model: str, to_model: str, from_api: str = "", to_api: str = "") -> Text:
    """``flagship → medium``; across providers each side names its API, the change being
    the news (``flagship (openai) → claude (anthropic)``). Within one provider the APIs
    would repeat on every line and say nothing."""
    crosses = bool(from_api and to_api and from_api != to_api)
    out = Text()
    for i, (model, api) in enumerate(((from_model, from_api), (to_model, to_api))):
        if i:
            out.append(" → ", style="bold magenta" if crosses else "")
        out.append(model, style="bold")
        if crosses:
            out.append(f" ({api})", style=API_STYLES.get(api, ""))
    return out


def fallback_line(from_model: str, to_model: str, n: int, reason: str, from_api: str = "", to_api: str = "") -> Text:
    count = f"{n} fallback{'s' if n != 1 else ''} " if n > 1 else "fell back "
    line = Text.assemble(("↪ ", "yellow"), count, fallback_pair(from_model, to_model, from_api, to_api))
    return _why(line, reason)


def moved_line(model: str, from_endpoint: str, to_endpoint: str, to_deployment: str, n: int, reason: str) -> Text:
    """``⇉ claude moved anthropic → vertex-us as claude-sonnet-4-5@20250929 ×3``: the same
    model at another of its deployments, no fallback (the id named where it is not the
    model's name; ``n`` moves in one second)."""
    line = Text.assemble(("⇉ ", "cyan"), (model, "bold"), f" moved {from_endpoint} → {to_endpoint}")
    if to_deployment and to_deployment != model:
        line.append(f" as {to_deployment}")
    if n > 1:
        line.append(f" ×{n}", style="bold")
    return _why(line, reason)


def key_line(e: ev.KeyParked) -> Text:
    what = "disabled" if e.until is None else f"parked ({e.kind})"
    line = Text.assemble(("⚷ ", "yellow"), f"key {e.key_alias} of {e.target} {what}")
    if e.reason:
        line.append(f": {text.shorten(e.reason, 60)}", style="dim")
    return line


def pin_line(e: ev.ModelPinned) -> Text:
    if e.model is None:
        return Text("⇄ automatic routing (unpinned)", style="bold cyan")
    return Text(f"▸ pinned {e.model}: traffic goes there first", style="bold cyan")


def notice_line(e: ev.Notice) -> Text:
    style = {"error": "bold red", "warning": "yellow"}.get(e.level, "")
    return Text(f"• {e.message}", style=style)
