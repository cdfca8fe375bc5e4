"""Shared pieces for the reliability suite: scenarios, configs pointing at a simulator,
and a counting event subscriber."""

from __future__ import annotations

import collections
import datetime as _dt
import math as _math
import os
import re as _re
import socket
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from capmon.core.types import events as ev
from capmon.core.types.config import SIMULATOR_DEMO_KEY, Config
from capmon.sim.scenario import ModelSpec, Scenario
from tests.support.configs import SIMULATED_MODELS, build_config, shipped_config

SIM_MODELS = ("sim-flagship", "sim-medium", "sim-small")
ENV = {"REL_KEY": SIMULATOR_DEMO_KEY}


def scenario(
    slots: int = 64,
    base_latency: float = 0.05,
    per_token: float = 0.0,
    answer_tokens: int = 16,
    models: Iterable[str] = SIM_MODELS,
    **kw: Any,
) -> Scenario:
    """Ample capacity, short, noiseless latency: faults are the only thing that goes wrong."""
    return Scenario(
        name="reliability",
        models=tuple(
            ModelSpec(
                name=m,
                slots=slots,
                base_latency=base_latency,
                per_token=per_token,
                noise=0.0,
                answer_tokens=answer_tokens,
                context_window=128_000,
                **kw,
            )
            for m in models
        ),
    )


def cli_config(folder: Path, base_latency: float) -> Path:
    """The shipped config.toml for a real `capmon batch` process: its embedded simulator on a free
    loopback port, serving the CLI tests' fast scenario at ``base_latency``."""
    from tests.batch.test_cli import SCENARIO

    return shipped_config(folder, SCENARIO.replace("base_latency = 0.005", f"base_latency = {base_latency}"))[0]


def read_only_query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on a job database, opened read-only (the runner may hold it)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def dead_url() -> str:
    """A loopback URL nobody listens on (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def sim_config(
    base_url: str,
    *,
    models: dict[str, list[str]] | None = None,
    endpoints: dict[str, str] | None = None,
    extra: str = "",
    env: str = "REL_KEY",
    file: str = "reliability.toml",
) -> Config:
    """Three models (flagship, medium, small -> sim-*) on the simulator at ``base_url``.
    ``endpoints`` adds named endpoints; ``models`` says which endpoints each model uses."""
    uses = {"flagship": ["sim"], "medium": ["sim"], "small": ["sim"], **(models or {})}
    return build_config(
        base_url,
        endpoint="sim",
        endpoints=endpoints,
        keys=[(env, "k")],
        extra=extra,
        file=file,
        models={m: {**SIMULATED_MODELS[m], "endpoints": uses[m], "max_tokens": 64} for m in uses},
    )


@dataclass
class Recorder:
    """Subscribes to a bus; keeps counts (and optionally every event)."""

    keep: bool = False
    counts: collections.Counter = field(default_factory=collections.Counter)
    events: list[ev.Event] = field(default_factory=list)
    received: int = 0

    def __call__(self, event: ev.Event) -> None:
        self.received += 1
        self.counts[type(event).__name__] += 1
        if self.keep:
            self.events.append(event)


async def set_fault(sim: Any, **rule: Any) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        r = await c.post(f"{sim.admin_url}/faults", json=rule)
        r.raise_for_status()


async def set_faults(sim: Any, rules: list[dict[str, Any]]) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        r = await c.post(f"{sim.admin_url}/faults", json=rules)
        r.raise_for_status()


async def sim_stats(sim: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        return (await c.get(f"{sim.admin_url}/stats")).json()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tcp_connections(port: int) -> int:
    """Established client->server TCP connections to 127.0.0.1:port (this process's view
    from /proc/net/tcp: counts both ends, so halve it for pairs)."""
    target = f"0100007F:{port:04X}"
    n = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            if parts[1] == target or parts[2] == target:
                if parts[3] == "01":  # ESTABLISHED
                    n += 1
    return n


# ---------------------------------------------------------------- TOML writing (for fuzzing)

_BARE_KEY = _re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def toml_string(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(value: Any) -> str:
    """One TOML value, inline (tables as inline tables), for any value tomllib can return."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if _math.isnan(value):
            return "nan"
        if _math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not a TOML value: {value!r}")


def toml_document(doc: dict[str, Any]) -> str:
    """A document whose top-level tables are written as [table] / [[array]] sections when
    they can be, so the loader sees the shapes people write, and inline otherwise."""
    lines: list[str] = []
    sections: list[str] = []
    for key, value in doc.items():
        if isinstance(value, dict) and value and all(not isinstance(v, dict) for v in value.values()):
            sections.append(
                f"\n[{toml_key(key)}]\n" + "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in value.items())
            )
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                sections.append(
                    f"\n[[{toml_key(key)}]]\n" + "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in item.items())
                )
        else:
            lines.append(f"{toml_key(key)} = {toml_value(value)}\n")
    return "".join(lines) + "".join(sections)
