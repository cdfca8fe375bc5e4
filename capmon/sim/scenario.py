"""Scenario TOML -> frozen, validated dataclasses.

A scenario says which keys the simulator accepts, which models it serves, how much
each can hold at once, how fast it answers, how it words a rejection, and how that
changes over time. The format is documented at the top of ``scenarios/demo.toml``.
Every error names the file and the key that is wrong (``models[0].schedule[1].at``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capmon.core.base.exceptions import ConfigError
from capmon.core.base.hints import MAX_HINT  # the client ignores longer hints anyway
from capmon.core.base.schema import Loader, parse_toml, read_text, spec
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.dialects import (
    CAPACITY_DIALECTS,
    MODEL_APIS,
    UNSUPPORTED_AZURE,
    UNSUPPORTED_DIALECTS,
    UNSUPPORTED_OPENAI,
    WIRE_DIALECTS,
    Wire,
)
from capmon.sim.usage import HONEST, USAGE_MODES

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

# The demo key first; the numbered ones let a config try "another key" against the simulator.
DEFAULT_KEYS: tuple[str, ...] = (SIMULATOR_DEMO_KEY, "sk-capmon-sim-1", "sk-capmon-sim-2", "sk-capmon-sim-3")
ANY_KEY = "*"
ANTHROPIC_MAX_REQUEST_BYTES = 32 * 1024 * 1024  # the Messages API's limit (docs.anthropic.com/en/api/overview)

# Upper bounds that keep every computed time finite (a latency of 1e308 times a factor
# is infinity, and a request that sleeps forever is a fault, not a scenario).
MAX_LATENCY = 86_400.0  # seconds to the first token
MAX_PER_TOKEN = 60.0
MAX_LATENCY_FACTOR = 1000.0

# How a successful stream is framed (capmon/sim/streams.py says where each shape comes from).
STREAM_STYLES: tuple[str, ...] = ("openai", "azure", "openrouter", "vllm", "ollama")
# A model's dialect, stream_style and unsupported_dialect default to its wire's own.
AUTO = "auto"
# "auto": a tool call when tool_choice asks for one ("required" or a named function) or the
# last user message asks for a tool (the rule in tools.py);
# "always": any request that carries tools is answered with a call (unless tool_choice is "none");
# "none": the model has no tools: a request that carries them gets OpenAI's 400 ("Unsupported
# parameter: 'tools' is not supported with this model.").
NO_TOOLS = "none"
TOOL_MODES: tuple[str, ...] = ("auto", "always", NO_TOOLS)
TOKEN_PARAMS: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
# "requests": count a key's requests to a model soon after that model rejected it (hammering);
# "rejections": count a key's capacity rejections, whatever the model.
PENALTY_BASES: tuple[str, ...] = ("requests", "rejections")


def _number(default: Any, **limits: Any) -> Any:
    """A number field: scenario files have always said "a finite number" when a value is not one."""
    return spec(default, expected="a finite number", **limits)


@dataclass(frozen=True)
class Phase:
    """From ``at`` seconds after start until the next phase. A key left out takes the
    model's own value, so an empty phase (only ``at``) means "back to normal"."""

    at: float = _number(dataclasses.MISSING, min=0.0, missing="missing; expected seconds since start")
    slots: int | None = spec(None, min=0)
    latency_factor: float | None = _number(None, above=0.0, max=MAX_LATENCY_FACTOR)
    dialect: str | None = spec(None, choices=CAPACITY_DIALECTS)
    hint: float | None = _number(None, min=0.0, max=MAX_HINT)


@dataclass(frozen=True)
class ModelSpec:
    name: str = spec(missing='missing; expected a model name such as "sim-flagship"', nonempty=True, printable=True)
    slots: int = spec(8, min=0)
    base_latency: float = _number(0.5, min=0.0, max=MAX_LATENCY, doc="seconds to the first token")
    per_token: float = _number(0.005, min=0.0, max=MAX_PER_TOKEN, doc="seconds per completion token")
    noise: float = _number(0.1, min=0.0, max=1.0, doc="service time is multiplied by U(1 - noise, 1 + noise)")
    answer_tokens: int = spec(150, min=1, doc="a typical answer; max_tokens can only shorten it")
    context_window: int = spec(32_000, min=1)
    api: str = spec(
        Wire.OPENAI.value,
        choices=MODEL_APIS,
        doc="the wire it is served on: openai (/v1/chat/completions, /v1/responses), azure "
        "(/openai/deployments/{name}/..., /openai/v1/...), anthropic (/v1/messages), gemini "
        "(/v1beta/models/{name}:generateContent...), vertex (/v1/projects/{p}/locations/{r}/publishers/"
        "{google,anthropic}/models/{name}:...), bedrock (/model/{name}/converse, /converse-stream); several "
        "of them (gemini+vertex, anthropic+vertex, anthropic+bedrock, anthropic+vertex+bedrock); or all",
    )
    dialect: str = spec(
        AUTO,
        choices=(*CAPACITY_DIALECTS, AUTO),
        doc="auto: the wire's own (anthropic-529, gemini-503, vertex-429, bedrock-429...)",
    )
    hint: float | None = _number(None, min=0.0, max=MAX_HINT, doc="seconds; carried by rejections as the dialect does")
    schedule: tuple[Phase, ...] = spec((), expected="a list of [[{key}]] tables")
    stream_style: str = spec(AUTO, choices=(*STREAM_STYLES, AUTO), doc="auto: azure on the azure wire, else openai")
    tools: str = spec("auto", choices=TOOL_MODES)
    token_param: str = spec(
        "max_tokens", choices=TOKEN_PARAMS, doc='"max_completion_tokens": a request that sends max_tokens gets 400'
    )
    unsupported_dialect: str = spec(
        AUTO, choices=(*UNSUPPORTED_DIALECTS, AUTO), doc="how that 400 is worded; auto: the wire's own"
    )
    prefill: bool = spec(
        True,
        doc="takes an assistant prefill; false: a request ending with the model's message gets Anthropic's 400 "
        '"This model does not support assistant message prefill" (as Claude Sonnet 4.6 and Opus 4.7 do)',
    )
    usage: str = spec(
        HONEST,
        choices=USAGE_MODES,
        doc="how its answers report the tokens used: honest, or huge, negative, "
        "float or string counts (a broken or hostile provider)",
    )

    labels: tuple[str, ...] = spec(
        (),
        doc='answers a prompt whose last user message starts with "Classify:" with one of these, chosen '
        "from a hash of the prompt (capmon/sim/labels.py); empty: such prompts get the usual text",
    )
    disagree: float = _number(
        0.0, min=0.0, max=1.0, doc="the share of classify prompts it answers with another label than the hash's"
    )

    def __post_init__(self) -> None:
        # "auto" becomes the wire's own here, so everything downstream sees a real value.
        azure = self.api == Wire.AZURE.value
        for name, value in (
            ("dialect", WIRE_DIALECTS.get(self.api, WIRE_DIALECTS[Wire.OPENAI.value])),
            ("stream_style", "azure" if azure else "openai"),
            ("unsupported_dialect", UNSUPPORTED_AZURE if azure else UNSUPPORTED_OPENAI),
        ):
            if getattr(self, name) == AUTO:
                object.__setattr__(self, name, value)


@dataclass(frozen=True)
class PenaltySpec:
    """``basis = "requests"``: a key that sends more than ``threshold`` requests to a model
    within ``window`` seconds of that model rejecting it is answered 429 for ``duration``
    seconds. ``basis = "rejections"``: more than ``threshold`` capacity rejections of a key
    within ``window`` seconds do the same."""

    enabled: bool = spec(False)
    threshold: int = spec(20, min=1)
    window: float = _number(10.0, above=0.0)
    duration: float = _number(30.0, above=0.0)
    basis: str = spec("requests", choices=PENALTY_BASES)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str = spec("custom", nonempty=True, printable=True)
    description: str = spec("")
    seed: int = spec(0)
    repeat: float = _number(0.0, min=0.0, doc="schedules loop with this period; 0 plays them once")
    keys: tuple[str, ...] = spec(
        DEFAULT_KEYS,
        nonempty=True,
        each={"nonempty": True},
        expected=f'a non-empty list of keys such as ["{SIMULATOR_DEMO_KEY}"]',
        doc=f'"{ANY_KEY}" accepts any non-empty key',
    )
    penalty: PenaltySpec = spec(factory=PenaltySpec)
    max_request_bytes: int = spec(
        ANTHROPIC_MAX_REQUEST_BYTES, min=1, doc="a bigger /v1/messages body gets Anthropic's 413 request_too_large"
    )
    models: tuple[ModelSpec, ...] = spec(
        missing="expected at least one [[models]] table", nonempty=True, expected="at least one [[models]] table"
    )
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
            raise ConfigError(
                text, "", f"no bundled scenario or file by that name; bundled: {', '.join(bundled_scenarios())}"
            )
    return parse_scenario(read_text(path), str(path), default_name=path.stem)


def parse_scenario(text: str, file: str = "<string>", *, default_name: str = "custom") -> Scenario:
    raw = {"name": default_name, **parse_toml(text, file)}
    loader = Loader(file)
    scn: Scenario = dataclasses.replace(loader.table(Scenario, raw, ""), source=file)
    for i, m in enumerate(scn.models):
        _check_schedule(loader, m.schedule, f"models[{i}]", scn.repeat)
    seen: set[str] = set()
    for i, m in enumerate(scn.models):
        if m.name in seen:
            raise loader.fail(f"models[{i}].name", f"duplicate model name {m.name!r}")
        seen.add(m.name)
    return scn


def _check_schedule(loader: Loader, schedule: tuple[Phase, ...], key: str, repeat: float) -> None:
    for j in range(1, len(schedule)):
        if schedule[j].at <= schedule[j - 1].at:
            raise loader.fail(
                f"{key}.schedule[{j}].at",
                f"expected phases in time order, after {schedule[j - 1].at:g}, got {schedule[j].at:g}",
            )
    if repeat > 0:
        for j, p in enumerate(schedule):
            if p.at >= repeat:
                raise loader.fail(f"{key}.schedule[{j}].at", f"expected less than repeat ({repeat:g}), got {p.at:g}")
