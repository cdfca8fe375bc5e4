"""A config whose engine embeds the simulator (started by the engine itself, on its own loop,
as the shipped config does), on a port of the test's own, with a scenario written for it:
flagship on the OpenAI wire, claude on Anthropic's, medium on the OpenAI wire, in that
preference order; and what a test does to the simulator (its /admin API) and to the engine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from capmon.core.types.config import Config, load_config
from capmon.inprocess.home import RUNTIME
from tests.support import configs
from tests.support.scripted import free_port

HELLO = [{"role": "user", "content": "Say something about capacity."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLAUDE_WEATHER_TOOL = {
    "name": "get_weather",
    "description": "the weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
MODELS = (("flagship", "openai"), ("claude", "anthropic"), ("medium", "openai"))
ANSWER_TOKENS = 6
BASE_LATENCY = 0.002  # seconds: every simulated model answers at once, as near as a real socket allows


def _scenario(full: Iterable[str]) -> str:
    out = 'name = "sdk"\n'
    for name, api in MODELS:
        out += (
            f'\n[[models]]\nname = "sim-{name}"\napi = "{api}"\nslots = {0 if name in full else 16}\n'
            f"base_latency = {BASE_LATENCY}\nper_token = 0.0\nnoise = 0.0\nanswer_tokens = {ANSWER_TOKENS}\n"
        )
    return out


def write_config(where: Path, *, full: Iterable[str] = (), extra: str = "") -> Path:
    """A config file (and its scenario) in ``where``; the models in ``full`` have no slots."""
    port = free_port()
    (where / "scenario.toml").write_text(_scenario(tuple(full)))
    return configs.write_config(
        where / "capmon.toml",
        f"http://127.0.0.1:{port}/v1",
        endpoint="sim",
        endpoints={"sim-anthropic": {"base_url": f"http://127.0.0.1:{port}", "api": "anthropic"}},
        simulated=True,
        keys=[("CAPMON_SIM_API_KEY", "sim-key")],
        models=configs.sim_models(
            [m for m, _ in MODELS], on={m: "sim-anthropic" for m, api in MODELS if api == "anthropic"}
        ),
        simulator={"enabled": True, "listen": f"127.0.0.1:{port}", "scenario": "scenario.toml"},
        extra=extra,
    )


def config(where: Path, **kw: Any) -> Config:
    return load_config(write_config(where, **kw))


def admin_url(cfg: Config) -> str:
    return f"http://{cfg.simulator.listen}/admin"


def fill(cfg: Config, *models: str) -> None:
    """Take every slot of these simulated models away (each answers at capacity)."""
    with httpx.Client(trust_env=False, timeout=10) as http:
        for m in models:
            http.post(f"{admin_url(cfg)}/models/sim-{m}", json={"slots": 0}).raise_for_status()


async def afill(cfg: Config, *models: str) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        for m in models:
            (await http.post(f"{admin_url(cfg)}/models/sim-{m}", json={"slots": 0})).raise_for_status()


def slow(cfg: Config, model: str, seconds: float) -> None:
    """Make a simulated model take ``seconds`` to answer."""
    with httpx.Client(trust_env=False, timeout=10) as http:
        factor = seconds / BASE_LATENCY
        http.post(f"{admin_url(cfg)}/models/sim-{model}", json={"latency_factor": factor}).raise_for_status()


@contextlib.contextmanager
def fresh_engine() -> Iterator[None]:
    """Each test starts with no engine and no config in the process, and leaves none."""
    RUNTIME.close()
    RUNTIME.config = None
    try:
        yield
    finally:
        RUNTIME.close()
        RUNTIME.config = None
