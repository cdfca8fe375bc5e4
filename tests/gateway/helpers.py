"""A gateway on a loopback port in front of a client of the simulator, in the test's own
event loop: real uvicorn, real sockets, the real openai SDK."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
from google import genai
from google.genai import types as genai_types
from starlette.applications import Starlette

from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import SIMULATOR_DEMO_KEY, Config, parse_config
from capmon.gateway import GatewayServer, close_app, create_app, load_settings, start_server
from capmon.gateway.connections import ConnectionLimits
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import SimHandle, start_simulator
from tests.support.configs import config_toml, sim_models

MODELS = ("flagship", "medium", "small")
ENV = {"GW_PROVIDER_KEY": SIMULATOR_DEMO_KEY}
HELLO = [{"role": "user", "content": "Say something about capacity."}]
HEADER_STYLES = ("2026-10-21", "2023-06-01")  # SDK 2.x's (Bearer), and the previous major's (x-api-key)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CLAUDE_WEATHER_TOOL = {
    "name": "get_weather",
    "description": "the weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


CHAT_ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "sim-flagship",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
}


@contextlib.asynccontextmanager
async def upstream(app: Starlette) -> AsyncIterator[str]:
    """A test's own upstream (``app``, served by real uvicorn on a loopback port): its base URL."""
    limits = ConnectionLimits(header_timeout=10, keep_alive_timeout=15, write_timeout=30, max_connections=100)
    server = await start_server(app, "127.0.0.1", 0, limits=limits)
    try:
        yield server.base_url
    finally:
        await server.stop()


def spec(
    name: str,
    slots: int = 8,
    base_latency: float = 0.2,
    answer_tokens: int = 12,
    window: int = 128_000,
    per_token: float = 0.0,
    **kw: Any,
) -> ModelSpec:
    return ModelSpec(
        name=f"sim-{name}",
        slots=slots,
        base_latency=base_latency,
        per_token=per_token,
        noise=0.0,
        answer_tokens=answer_tokens,
        context_window=window,
        **kw,
    )


def scenario(*specs: ModelSpec, keys: tuple[str, ...] | None = None) -> Scenario:
    models = specs or tuple(spec(m) for m in MODELS)
    return Scenario(name="gateway", models=models, **({"keys": keys} if keys else {}))


def two_wires(keys: tuple[str, ...] | None = None) -> Scenario:
    """flagship on the simulator's OpenAI wire, claude on its Anthropic wire."""
    return scenario(spec("flagship"), spec("claude", api="anthropic"), keys=keys)


def config(
    base_url: str,
    *,
    models: tuple[str, ...] = MODELS,
    extra: str = "",
    gateway: str = "",
    key_env: str = "GW_PROVIDER_KEY",
    max_tokens: int = 64,
    anthropic: tuple[str, ...] = (),
    anthropic_version: str = "2026-10-21",
    anthropic_headers: str = "",
    prices: Mapping[str, Mapping[str, float]] | None = None,
) -> Config:
    """The models in ``models``' order, on the simulator's OpenAI wire (endpoint ``sim``),
    but those in ``anthropic``, on its Anthropic wire (endpoint ``anthropic``, the simulator's
    origin, ``anthropic_version``, ``anthropic_headers`` as a TOML inline table); ``extra``
    and ``gateway`` (the ``[gateway]`` section's lines) are TOML, as tests write them; ``prices``:
    a model's ``prices`` table, by its name."""
    endpoints: dict[str, Any] = {}
    if anthropic:
        headers = tomllib.loads(f"headers = {anthropic_headers}") if anthropic_headers else {}
        endpoints["anthropic"] = {
            "base_url": base_url.removesuffix("/v1"),
            "api": "anthropic",
            "anthropic_version": anthropic_version,
            "keys": [(key_env, "claude-key")],
            **headers,
        }
    specs = sim_models(models, on=dict.fromkeys(anthropic, "anthropic"), max_tokens=max_tokens)
    priced = {name: {"prices": p} for name, p in (prices or {}).items()}
    text = config_toml(
        base_url,
        endpoint="sim",
        keys=[(key_env, "sim-key")],
        endpoints=endpoints,
        models={name: {**spec, **priced.get(name, {})} for name, spec in specs.items()},
        extra=extra + (f"\n[gateway]\n{gateway}\n" if gateway else ""),
    )
    return parse_config(text, "gateway-test.toml")


@dataclass
class Running:
    sim: SimHandle
    client: FallbackClient
    app: Starlette
    server: GatewayServer

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def origin(self) -> str:
        return self.server.origin

    def openai(self, key: str = "any-key-works-here") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=key, max_retries=0)

    def anthropic(self, key: str = "any-key-works-here", *, style: str = "2026-10-21") -> anthropic.AsyncAnthropic:
        """The anthropic SDK (2.x) at the gateway, sending its key and version as SDK 2.x
        does (``2026-10-21``: Bearer) or as the previous major did (``2023-06-01``: x-api-key)."""
        if style == "2026-10-21":
            return anthropic.AsyncAnthropic(base_url=self.origin, api_key=key, max_retries=0)
        old = {"anthropic-version": "2023-06-01", "x-api-key": key, "Authorization": anthropic.omit}
        return anthropic.AsyncAnthropic(base_url=self.origin, api_key=key, max_retries=0, default_headers=old)

    def gemini(self, key: str = "any-key-works-here", *, version: str = "v1beta") -> genai.Client:
        """The google-genai SDK at the gateway's Gemini API (``x-goog-api-key``; no retries:
        capmon's own are what is tested). Its async side is ``.aio``."""
        options = genai_types.HttpOptions(base_url=self.origin, api_version=version, timeout=600_000)
        return genai.Client(api_key=key, http_options=options)

    def http(self, key: str | None = None) -> httpx.AsyncClient:
        # JSON, as every API client says: the open gateway refuses a POST that is not (browsers.py).
        headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})
        return httpx.AsyncClient(base_url=self.origin, headers=headers, trust_env=False, timeout=600)

    async def sim_admin(self, path: str, body: Mapping[str, Any]) -> Any:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
            r = await c.post(f"{self.sim.admin_url}/{path}", json=body)
            r.raise_for_status()
            return r.json()

    async def sim_model(self, name: str) -> Any:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
            r = await c.get(f"{self.sim.admin_url}/models/{name}")
            r.raise_for_status()
            return r.json()


@contextlib.asynccontextmanager
async def running(
    scn: Scenario | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    built: Callable[[str], Config] | None = None,
    **config_kw: Any,
) -> AsyncIterator[Running]:
    """``built``: the config from the simulator's base URL, when :func:`config`'s parts are not enough."""
    sim = await start_simulator(scn or scenario())
    try:
        async with gateway_for(sim.base_url, environ=environ, built=built, **config_kw) as (client, app, server):
            yield Running(sim, client, app, server)
    finally:
        await sim.stop()


@contextlib.asynccontextmanager
async def gateway_for(
    base_url: str,
    *,
    environ: Mapping[str, str] | None = None,
    built: Callable[[str], Config] | None = None,
    **config_kw: Any,
) -> AsyncIterator[tuple[FallbackClient, Starlette, GatewayServer]]:
    """A gateway on a loopback port whose models are at ``base_url`` (the simulator, or
    a test's own upstream)."""
    cfg = built(base_url) if built is not None else config(base_url, **config_kw)
    env = {**ENV, **(environ or {})}
    async with FallbackClient(cfg, environ=env) as client:
        app = create_app(client, load_settings(cfg, listen="127.0.0.1:0", environ=env))
        server = await start_server(app, "127.0.0.1", 0)
        try:
            yield client, app, server
        finally:
            close_app(app)
            await server.stop()


async def until(check: Callable[[], Any], what: str, seconds: float = 5.0) -> None:
    """Wait (on the loop's clock) until ``check()`` (or what it awaits to) is true."""
    for _ in range(int(seconds / 0.01)):
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {seconds}s: {what}")


def sse_frames(text: str) -> list[dict[str, Any]]:
    """Each SSE frame as {"event": ..., "data": ..., "id": ...} (comments left out)."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        frame: dict[str, Any] = {}
        data = []
        for line in block.split("\n"):
            if line.startswith(":") or not line:
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            else:
                frame[name] = value
        if data:
            frame["data"] = "\n".join(data)
        if frame:
            out.append(frame)
    return out


def data_of(frames: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(f["data"]) for f in frames if "data" in f and f["data"] != "[DONE]"]


def serve_process(
    config: Path, port: int, *argv: str, cwd: Path | None = None, drop: tuple[str, ...] = ("CAPMON_",)
) -> subprocess.Popen[str]:
    """``capmon serve`` as a user runs it, in a process of its own on ``config`` and ``port``
    (the environment without variables starting with ``drop``), its stdout and stderr piped:
    the caller reads the banner line and stops it with a signal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return subprocess.Popen(
        [sys.executable, "-m", "capmon.cli", "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
