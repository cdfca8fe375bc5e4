"""Pure formatting: snapshot values -> short Rich Text for cells, panels and the log.

No widgets and no time here: every countdown is a deadline minus the snapshot's
``now``, so the same snapshot always renders the same text (snapshot tests rely
on it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text

from capmon.core import events as ev
from capmon.core.snapshot import TargetSnapshot


@dataclass(frozen=True)
class StateLook:
    glyph: str
    word: str
    style: str


# Colour, glyph AND word, so a state reads without colour too. Manual states use a
# hand and a reversed style so they never pass for something the breaker did.
STATES: dict[str, StateLook] = {
    "closed": StateLook("●", "closed", "green"),
    "half-open": StateLook("◐", "half-open", "bold yellow"),
    "ramp": StateLook("◑", "ramp", "cyan"),
    "open": StateLook("○", "open", "bold red"),
    "forced-open": StateLook("✋", "open (manual)", "bold white on red"),
    "forced-closed": StateLook("✋", "closed (manual)", "bold black on green"),
}
_UNKNOWN = StateLook("?", "?", "magenta")

SPARK_CHARS = "▁▂▃▄▅▆▇█"


def state_text(t: TargetSnapshot) -> Text:
    look = STATES.get(t.state, _UNKNOWN)
    word = look.word if look is not _UNKNOWN else t.state
    if t.state == "ramp" and t.ramp_share is not None:
        word = f"ramp {t.ramp_share:.0%}"
    return Text(f"{look.glyph} {word}", style=look.style)


def duration(seconds: float) -> str:
    """A short countdown: 4.2s, 42s, 3m05s, 1h02m."""
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        m, sec = divmod(int(s), 60)
        return f"{m}m{sec:02d}s"
    h, rem = divmod(int(s), 3600)
    return f"{h}h{rem // 60:02d}m"


def short_duration(seconds: float) -> str:
    """At most three characters of number: 42s, 59m, 3h."""
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s // 60:.0f}m"
    return f"{s // 3600:.0f}h"


def cooldown_text(t: TargetSnapshot, now: float) -> Text:
    if t.state == "forced-open":
        return Text("manual", style="red")
    if t.cooldown_until is not None and t.cooldown_until > now:
        return Text(duration(t.cooldown_until - now), style="bold red")
    return Text("-", style="dim")


def latency(seconds: float | None) -> Text:
    if seconds is None:
        return Text("-", style="dim")
    if seconds < 1:
        return Text(f"{seconds * 1000:.0f}ms")
    return Text(f"{seconds:.2f}s")


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
    if t.key_state == "disabled":
        return Text("disabled", style="bold white on red")
    if t.key_state == "parked":
        left = f" {short_duration(t.key_until - now)}" if t.key_until is not None else ""
        return Text(f"parked{left}", style="bold yellow")
    return Text("ok", style="dim")


def last_status(t: TargetSnapshot) -> Text:
    if t.last_status is None:
        return Text("-", style="dim")
    style = "green" if t.last_status < 300 else "yellow" if t.last_status == 429 else "red"
    return Text(str(t.last_status), style=style)


def clock_time(wall: float) -> str:
    """HH:MM:SS in local time (tests pin TZ=UTC)."""
    return time.strftime("%H:%M:%S", time.localtime(wall))


# ---------------------------------------------------------------- event log lines


def breaker_line(e: ev.BreakerChanged) -> Text:
    look = STATES.get(e.new, _UNKNOWN)
    line = Text()
    line.append(f"{look.glyph} {e.model}", style=look.style)
    line.append(f" breaker {e.old} → {e.new}")
    if e.reason:
        line.append(f" ({e.reason})", style="dim")
    if e.new == "open" and e.cooldown_until is not None:
        line.append(f", next probe in {duration(e.cooldown_until - e.at)}", style="dim")
    return line


def probe_line(e: ev.ProbeFinished) -> Text:
    line = Text()
    if e.ok:
        line.append(f"◌ {e.model}", style="green")
        took = f" in {latency(e.latency).plain}" if e.latency is not None else ""
        line.append(f" probe answered{took}: the ramp starts")
        return line
    line.append(f"◌ {e.model}", style="red" if e.ok is False else "dim")
    line.append(f" probe {'failed' if e.ok is False else 'not sent'}")
    if e.reason:
        line.append(f" ({short(e.reason, 50)})", style="dim")
    if e.next_probe_at is not None:
        line.append(f", next in {duration(e.next_probe_at - e.at)}", style="dim")
    return line


def ramp_line(e: ev.RampStep) -> Text:
    line = Text()
    line.append(f"◑ {e.model}", style="cyan")
    line.append(f" ramp {e.share:.0%}")
    if e.reason:
        line.append(f" ({short(e.reason, 50)})", style="dim")
    return line


def token_param_line(e: ev.TokenParamLearned) -> Text:
    line = Text()
    line.append(f"⚙ {e.model}", style="bold")
    line.append(f" sends {e.param} from now on")
    if e.reason:
        line.append(f" ({short(e.reason, 60)})", style="dim")
    return line


def fallback_line(from_model: str, to_model: str, n: int, reason: str) -> Text:
    line = Text()
    line.append("↪ ", style="yellow")
    line.append(f"{n} fallback{'s' if n != 1 else ''} " if n > 1 else "fell back ")
    line.append(from_model, style="bold")
    line.append(" → ")
    line.append(to_model, style="bold")
    if reason:
        line.append(f" ({short(reason, 60)})", style="dim")
    return line


def key_line(e: ev.KeyParked) -> Text:
    what = "disabled" if e.until is None else f"parked ({e.kind})"
    line = Text()
    line.append("⚷ ", style="yellow")
    line.append(f"key {e.key_alias} of {e.target} {what}")
    if e.reason:
        line.append(f": {short(e.reason, 60)}", style="dim")
    return line


def pin_line(e: ev.ModelPinned) -> Text:
    if e.model is None:
        return Text("⇄ automatic routing (unpinned)", style="bold cyan")
    return Text(f"▸ pinned {e.model}: traffic goes there first", style="bold cyan")


def notice_line(e: ev.Notice) -> Text:
    style = {"error": "bold red", "warning": "yellow"}.get(e.level, "")
    return Text(f"• {e.message}", style=style)


def short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
