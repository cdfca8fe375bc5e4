"""Scenario TOML -> frozen, validated dataclasses.

A scenario says which keys the simulator accepts, which models it serves, how much
each can hold at once, how fast it answers, how it words a rejection, and how that
changes over time. The format is documented at the top of ``scenarios/demo.toml``.
Every error names the file and the key that is wrong (``models[0].schedule[1].at``).
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from capmon.core.config import SIMULATOR_DEMO_KEY, key_text
from capmon.core.exceptions import ConfigError
from capmon.core.hints import MAX_HINT  # the client ignores longer hints anyway
from capmon.sim.dialects import CAPACITY_DIALECTS, OPENAI_503, UNSUPPORTED_DIALECTS

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

# The demo key first; the numbered ones let a config try "another key" against the simulator.
DEFAULT_KEYS: tuple[str, ...] = (SIMULATOR_DEMO_KEY, "sk-capmon-sim-1", "sk-capmon-sim-2", "sk-capmon-sim-3")
ANY_KEY = "*"

# Upper bounds that keep every computed time finite (a latency of 1e308 times a factor
# is infinity, and a request that sleeps forever is a fault, not a scenario).
MAX_LATENCY = 86_400.0  # seconds to the first token
MAX_PER_TOKEN = 60.0
MAX_LATENCY_FACTOR = 1000.0

# How a successful stream is framed (capmon/sim/streams.py says where each shape comes from).
STREAM_STYLES: tuple[str, ...] = ("openai", "azure", "openrouter", "vllm", "ollama")
# "auto": a tool call only when tool_choice asks for one ("required" or a named function);
# "always": any request that carries tools is answered with a call (unless tool_choice is "none").
TOOL_MODES: tuple[str, ...] = ("auto", "always")
TOKEN_PARAMS: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
# "requests": count a key's requests to a model soon after that model rejected it (hammering);
# "rejections": count a key's capacity rejections, whatever the model.
PENALTY_BASES: tuple[str, ...] = ("requests", "rejections")


@dataclass(frozen=True)
class Phase:
    """From ``at`` seconds after start until the next phase. A key left out takes the
    model's own value, so an empty phase (only ``at``) means "back to normal"."""

    at: float
    slots: int | None = None
    latency_factor: float | None = None
    dialect: str | None = None
    hint: float | None = None


@dataclass(frozen=True)
class ModelSpec:
    name: str
    slots: int = 8
    base_latency: float = 0.5  # seconds to the first token
    per_token: float = 0.005  # seconds per completion token
    noise: float = 0.1  # service time is multiplied by U(1 - noise, 1 + noise)
    answer_tokens: int = 150  # a typical answer; max_tokens can only shorten it
    context_window: int = 32_000
    dialect: str = OPENAI_503
    hint: float | None = None  # seconds; carried by rejections as the dialect does
    schedule: tuple[Phase, ...] = ()
    stream_style: str = "openai"  # one of STREAM_STYLES
    tools: str = "auto"  # one of TOOL_MODES
    token_param: str = "max_tokens"  # "max_completion_tokens": a request that sends max_tokens gets 400
    unsupported_dialect: str = "openai"  # how that 400 is worded: one of UNSUPPORTED_DIALECTS


@dataclass(frozen=True)
class PenaltySpec:
    """``basis = "requests"``: a key that sends more than ``threshold`` requests to a model
    within ``window`` seconds of that model rejecting it is answered 429 for ``duration``
    seconds. ``basis = "rejections"``: more than ``threshold`` capacity rejections of a key
    within ``window`` seconds do the same."""

    enabled: bool = False
    threshold: int = 20
    window: float = 10.0
    duration: float = 30.0
    basis: str = "requests"  # one of PENALTY_BASES


@dataclass(frozen=True)
class Scenario:
    models: tuple[ModelSpec, ...]
    name: str = "custom"
    description: str = ""
    seed: int = 0
    repeat: float = 0.0  # schedules loop with this period; 0 plays them once
    keys: tuple[str, ...] = DEFAULT_KEYS  # "*" accepts any non-empty key
    penalty: PenaltySpec = PenaltySpec()
    source: str = field(default="<code>", compare=False)


# ---------------------------------------------------------------- loading


def bundled_scenarios() -> list[str]:
    """Names of the scenarios shipped with capmon."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def load_scenario(name_or_path: str | os.PathLike[str]) -> Scenario:
    """A bundled scenario by name (``demo``) or a scenario TOML file by path."""
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, str) and text in bundled_scenarios():
        path = SCENARIO_DIR / f"{text}.toml"
    else:
        path = Path(text)
        if not path.exists():
            raise ConfigError(text, "", f"no bundled scenario or file by that name; "
                                        f"bundled: {', '.join(bundled_scenarios())}")
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), "", f"cannot read: {e}") from None
    return parse_scenario(raw, str(path), default_name=path.stem)


def parse_scenario(text: str, file: str = "<string>", *, default_name: str = "custom") -> Scenario:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(file, "", f"not valid TOML: {e}") from None
    return _Reader(file).scenario(raw, default_name)


def _got(value: Any) -> str:
    text = repr(value)
    return f"{text[:57] + '...' if len(text) > 60 else text} ({type(value).__name__})"


class _Reader:
    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.file, key, message)

    def known(self, raw: dict[str, Any], allowed: Iterable[str], key: str) -> None:
        allowed = list(allowed)
        for name in raw:
            if name not in allowed:
                close = difflib.get_close_matches(str(name), allowed, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(allowed)}"
                raise self.fail(f"{key}.{key_text(name)}" if key else key_text(name), f"unknown key{hint}")

    def table(self, raw: Any, key: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.fail(key, f"expected a table, got {_got(raw)}")
        return raw

    def number(self, raw: Any, key: str, *, lo: float | None = None, hi: float | None = None,
               above: float | None = None) -> float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw != raw or raw in (float("inf"), float("-inf")):
            raise self.fail(key, f"expected a finite number, got {_got(raw)}")
        if lo is not None and raw < lo:
            raise self.fail(key, f"expected a number >= {lo:g}, got {raw!r}")
        if hi is not None and raw > hi:
            raise self.fail(key, f"expected a number <= {hi:g}, got {raw!r}")
        if above is not None and raw <= above:
            raise self.fail(key, f"expected a number > {above:g}, got {raw!r}")
        return float(raw)

    def integer(self, raw: Any, key: str, *, lo: int | None = None) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise self.fail(key, f"expected a whole number, got {_got(raw)}")
        if lo is not None and raw < lo:
            raise self.fail(key, f"expected a whole number >= {lo}, got {raw!r}")
        return raw

    def string(self, raw: Any, key: str, *, choices: tuple[str, ...] = (), nonempty: bool = False,
               printable: bool = False) -> str:
        if not isinstance(raw, str):
            raise self.fail(key, f"expected a string, got {_got(raw)}")
        if choices and raw not in choices:
            raise self.fail(key, f"expected one of {', '.join(choices)}, got {raw!r}")
        if nonempty and not raw.strip():
            raise self.fail(key, "expected a non-empty string")
        if printable and not raw.isprintable():
            raise self.fail(key, f"expected a name without control characters, got {raw!r}")
        return raw

    def boolean(self, raw: Any, key: str) -> bool:
        if not isinstance(raw, bool):
            raise self.fail(key, f"expected true or false, got {_got(raw)}")
        return raw

    def scenario(self, raw: dict[str, Any], default_name: str) -> Scenario:
        self.known(raw, ["name", "description", "seed", "repeat", "keys", "penalty", "models"], "")
        name = self.string(raw.get("name", default_name), "name", nonempty=True, printable=True)
        description = self.string(raw.get("description", ""), "description")
        seed = self.integer(raw.get("seed", 0), "seed")
        repeat = self.number(raw.get("repeat", 0.0), "repeat", lo=0.0)
        keys = self.keys(raw.get("keys", list(DEFAULT_KEYS)))
        penalty = self.penalty(raw.get("penalty", {}))
        models_raw = raw.get("models")
        if not isinstance(models_raw, list) or not models_raw:
            raise self.fail("models", "expected at least one [[models]] table")
        models = tuple(self.model(m, f"models[{i}]", repeat) for i, m in enumerate(models_raw))
        seen: set[str] = set()
        for i, m in enumerate(models):
            if m.name in seen:
                raise self.fail(f"models[{i}].name", f"duplicate model name {m.name!r}")
            seen.add(m.name)
        return Scenario(models=models, name=name, description=description, seed=seed, repeat=repeat,
                        keys=keys, penalty=penalty, source=self.file)

    def keys(self, raw: Any) -> tuple[str, ...]:
        if not isinstance(raw, list) or not raw:
            raise self.fail("keys", f'expected a non-empty list of keys such as ["{SIMULATOR_DEMO_KEY}"], got {_got(raw)}')
        return tuple(self.string(k, f"keys[{i}]", nonempty=True) for i, k in enumerate(raw))

    def penalty(self, raw: Any) -> PenaltySpec:
        t = self.table(raw, "penalty")
        self.known(t, ["enabled", "threshold", "window", "duration", "basis"], "penalty")
        d = PenaltySpec()
        return PenaltySpec(
            enabled=self.boolean(t.get("enabled", d.enabled), "penalty.enabled"),
            threshold=self.integer(t.get("threshold", d.threshold), "penalty.threshold", lo=1),
            window=self.number(t.get("window", d.window), "penalty.window", above=0.0),
            duration=self.number(t.get("duration", d.duration), "penalty.duration", above=0.0),
            basis=self.string(t.get("basis", d.basis), "penalty.basis", choices=PENALTY_BASES),
        )

    def model(self, raw: Any, key: str, repeat: float) -> ModelSpec:
        t = self.table(raw, key)
        fields = ["name", "slots", "base_latency", "per_token", "noise", "answer_tokens", "context_window",
                  "dialect", "hint", "schedule", "stream_style", "tools", "token_param", "unsupported_dialect"]
        self.known(t, fields, key)
        if "name" not in t:
            raise self.fail(f"{key}.name", "missing; expected a model name such as \"sim-flagship\"")
        d = ModelSpec(name="")
        hint = t.get("hint")
        schedule_raw = t.get("schedule", [])
        if not isinstance(schedule_raw, list):
            raise self.fail(f"{key}.schedule", f"expected a list of [[{key}.schedule]] tables, got {_got(schedule_raw)}")
        schedule = tuple(self.phase(p, f"{key}.schedule[{j}]") for j, p in enumerate(schedule_raw))
        for j in range(1, len(schedule)):
            if schedule[j].at <= schedule[j - 1].at:
                raise self.fail(f"{key}.schedule[{j}].at",
                                f"expected phases in time order, after {schedule[j - 1].at:g}, got {schedule[j].at:g}")
        if repeat > 0:
            for j, p in enumerate(schedule):
                if p.at >= repeat:
                    raise self.fail(f"{key}.schedule[{j}].at", f"expected less than repeat ({repeat:g}), got {p.at:g}")
        return ModelSpec(
            name=self.string(t["name"], f"{key}.name", nonempty=True, printable=True),
            slots=self.integer(t.get("slots", d.slots), f"{key}.slots", lo=0),
            base_latency=self.number(t.get("base_latency", d.base_latency), f"{key}.base_latency", lo=0.0, hi=MAX_LATENCY),
            per_token=self.number(t.get("per_token", d.per_token), f"{key}.per_token", lo=0.0, hi=MAX_PER_TOKEN),
            noise=self.number(t.get("noise", d.noise), f"{key}.noise", lo=0.0, hi=1.0),
            answer_tokens=self.integer(t.get("answer_tokens", d.answer_tokens), f"{key}.answer_tokens", lo=1),
            context_window=self.integer(t.get("context_window", d.context_window), f"{key}.context_window", lo=1),
            dialect=self.string(t.get("dialect", d.dialect), f"{key}.dialect", choices=CAPACITY_DIALECTS),
            hint=None if hint is None else self.number(hint, f"{key}.hint", lo=0.0, hi=MAX_HINT),
            schedule=schedule,
            stream_style=self.string(t.get("stream_style", d.stream_style), f"{key}.stream_style",
                                     choices=STREAM_STYLES),
            tools=self.string(t.get("tools", d.tools), f"{key}.tools", choices=TOOL_MODES),
            token_param=self.string(t.get("token_param", d.token_param), f"{key}.token_param", choices=TOKEN_PARAMS),
            unsupported_dialect=self.string(t.get("unsupported_dialect", d.unsupported_dialect),
                                            f"{key}.unsupported_dialect", choices=UNSUPPORTED_DIALECTS),
        )

    def phase(self, raw: Any, key: str) -> Phase:
        t = self.table(raw, key)
        self.known(t, ["at", "slots", "latency_factor", "dialect", "hint"], key)
        if "at" not in t:
            raise self.fail(f"{key}.at", "missing; expected seconds since start")
        return Phase(
            at=self.number(t["at"], f"{key}.at", lo=0.0),
            slots=None if "slots" not in t else self.integer(t["slots"], f"{key}.slots", lo=0),
            latency_factor=None if "latency_factor" not in t else self.number(
                t["latency_factor"], f"{key}.latency_factor", above=0.0, hi=MAX_LATENCY_FACTOR),
            dialect=None if "dialect" not in t else self.string(t["dialect"], f"{key}.dialect",
                                                                choices=CAPACITY_DIALECTS),
            hint=None if "hint" not in t else self.number(t["hint"], f"{key}.hint", lo=0.0, hi=MAX_HINT),
        )
