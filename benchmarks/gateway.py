"""The gateway's added latency: ``capmon serve`` and LiteLLM's proxy against direct calls
to an endpoint that answers at once, under open-loop load, in one run.

    python -m benchmarks.gateway [--rates 100 500 1000] [--seconds 30] [--rows direct capmon ... litellm]
                                 [--before DIR] [--capmon-arg ARG ...] [--redis URL]
                                 [--soak SECONDS] [--json FILE]

Every process has its own, listens on 127.0.0.1 on a free port and is stopped at the end
(on an error or Ctrl-C too; the kernel stops it if this process dies):

* the endpoint: benchmarks/overhead.py's instant OpenAI-shaped app under uvicorn. It is
  not the simulator on purpose: the simulator's slots, schedules, token counts and
  penalty books cost CPU per request, and on 2 cores whatever the endpoint spends is
  taken from the gateway and the load generator. The instant app does the least an HTTP
  server can, so the rows differ by the proxy in between;
* ``capmon serve``: the library peer's config (benchmarks/capmon-bench.toml: three models,
  the aiohttp transport), on the endpoint, with a client key and its access log on (to a
  file); the limiter starts at its maximum, as in overhead.py, so the first seconds
  measure routing, not a slow start. Its rows: in memory, one process (``capmon``); on
  Redis (``--redis``, a namespace of the run's own) with one worker (``capmon-redis``) and
  with ``--workers 2`` (``capmon-w2``); on uvloop (``capmon-uvloop``); and, with
  ``--before DIR``, the same as ``capmon`` from another checkout of capmon (``git archive
  REV | tar -x -C DIR``): before and after a change, in one run. ``--capmon-arg ARG``
  (repeatable) gives every capmon row more of capmon serve's arguments (traces, when the
  gateway has a flag for them);
* LiteLLM's proxy (``litellm --config``, one worker, as it ships: uvloop, a master key),
  one model on the endpoint;
* the load generator, a fresh process per measurement: aiohttp in an open loop. Request i
  is due at t0 + i / rate and is sent then, whatever the earlier ones are doing; its
  latency runs from when it was due to its answer, so queueing anywhere (the generator,
  the kernel, the proxy) counts. Errors: a status other than 200, a 200 that is not a
  chat completion, no answer within 10 s (timeout), a connection error.

For each rate the rows are measured in turn, the order rotated from rate to rate so that
drift on a shared machine does not always fall on the same row: a 2 s warm-up at the
rate (not counted), then ``--seconds`` at the rate. "Added" is a proxy's percentile minus
direct's at the same rate; a proxy's CPU per request is its process's CPU time (its
workers' included) over the requests sent in the measurement and its warm-up. On the
direct row that column is the endpoint's own (a bare ASGI app under uvicorn), and the
generator's column is an aiohttp client's: the two halves of what any Python proxy on
this machine costs at the least, server and client, beside the proxies' figures.
``--soak SECONDS`` instead runs ``capmon serve`` alone at 500 requests per second and
samples its RSS every 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.ideal import percentile
from benchmarks.peers.capmon_gateway import start_gateway
from benchmarks.procs import (
    descendants,
    free_port,
    markdown_table,
    open_fds,
    rss_mb,
    spawn,
    stop,
    tree_cpu_seconds,
    wait_http,
    wait_port,
)

RATES = (100, 500, 1000)
ROWS = {  # --rows name -> the table's label
    "direct": "direct",
    "capmon-before": "capmon serve, --before",
    "capmon": "capmon serve",
    "capmon-redis": "capmon serve, Redis, 1 worker",
    "capmon-w2": "capmon serve, Redis, --workers 2",
    "capmon-uvloop": "capmon serve --loop uvloop",
    "litellm": "LiteLLM proxy",
}
DEFAULT_ROWS = ("direct", "capmon", "capmon-redis", "capmon-w2", "litellm")
REDIS_URL = "redis://127.0.0.1:6379/15"
MODEL = "sim-flagship"  # a model of capmon-bench.toml; LiteLLM's one model has the same name
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 16}).encode()
TIMEOUT = 10.0  # seconds: a request not answered by then is a timeout
MAX_OPEN = 1000  # connections the generator may hold; past them requests wait for one (and count it)
WARMUP = 2.0  # seconds at the rate before each measurement, not counted
SETTLE = 2.0  # seconds between measurements, for a proxy still working off the last one
LOAD_KEY_ENV = "CAPMON_BENCH_LOAD_KEY"  # the key the generator sends (from the environment: never in ps)
# Room for the whole load on the first model from the start: the measurement is routing, not learning.
CAPMON_SET = ("limiter.initial=64",)

# Goals on 2 cores (issue 12, item 5; issue 18, item 8).
GOAL_ADDED_P99_MS, GOAL_ADDED_AT = 5.0, 500
GOAL_CLEAN_AT = 1000
GOAL_CPU_US = 500.0  # the gateway's CPU per request, at GOAL_ADDED_AT
GOAL_ADDED_P99_HIGH_MS = 20.0  # added p99 at GOAL_CLEAN_AT
SOAK_RATE, SOAK_PERIOD, SOAK_SETTLED = 500, 10.0, 60.0
# "Flat": from the first minute on (pools, caches and the allocator's arenas fill), RSS
# grows by at most 0.1 MiB a minute: 144 MiB a day, about 3.5 bytes per request at 500/s.
GOAL_FLAT_MB_PER_MIN = 0.1
# The published anchor: LiteLLM proxy's p99 in TensorZero's gateway benchmark (2025-07);
# it failed at 1,000 QPS.
ANCHOR = {100: "5.9", 500: "39.7", 1000: "failed"}


# ---------------------------------------------------------------- the load generator (its own process)

Shot = tuple[float, float, str]  # (send lag, latency, outcome): seconds from when it was due; "ok" or the error


async def open_loop(send: Callable[[float], Coroutine[Any, Any, Shot]], rate: float, seconds: float) -> list[Shot]:
    """``rate`` x ``seconds`` calls of ``send(due)``, each started when it is due, whatever
    the earlier ones are doing; their outcomes in send order."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.01
    tasks: list[asyncio.Task[Shot]] = []
    for i in range(round(rate * seconds)):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(due)))
    return list(await asyncio.gather(*tasks))


def _outcome(status: int, body: bytes) -> str:
    if status != 200:
        return f"HTTP {status}"
    try:
        ok = isinstance(json.loads(body)["choices"], list)
    except (ValueError, KeyError, TypeError):
        ok = False
    return "ok" if ok else "not a chat completion"


async def generate(url: str, key: str, rate: float, seconds: float, warmup: float) -> dict[str, Any]:
    import aiohttp

    loop = asyncio.get_running_loop()
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(limit=MAX_OPEN)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session:

        async def send(due: float) -> Shot:
            sent = loop.time()
            try:
                async with session.post(url, data=BODY, headers=headers) as r:
                    outcome = _outcome(r.status, await r.read())
            except TimeoutError:
                outcome = "timeout"
            except (aiohttp.ClientConnectionError, OSError):
                outcome = "connection"
            except aiohttp.ClientError as e:
                outcome = type(e).__name__
            return sent - due, loop.time() - due, outcome

        await open_loop(send, rate, warmup)
        cpu0 = time.process_time()
        shots = await open_loop(send, rate, seconds)
        cpu = time.process_time() - cpu0
    return summarise(shots, rate, seconds, warmup, cpu)


def summarise(shots: Sequence[Shot], rate: float, seconds: float, warmup: float, cpu: float) -> dict[str, Any]:
    ok = [latency for _, latency, outcome in shots if outcome == "ok"]
    lags = [lag for lag, _, _ in shots]
    return {
        "rate": rate,
        "seconds": seconds,
        "sent": len(shots),
        "sent_in_all": len(shots) + round(rate * warmup),
        "ok": len(ok),
        "errors": dict(collections.Counter(o for _, _, o in shots if o != "ok")),
        "p50_ms": percentile(ok, 0.50) * 1000,
        "p99_ms": percentile(ok, 0.99) * 1000,
        "max_ms": max(ok) * 1000 if ok else float("nan"),
        "lag_p99_ms": percentile(lags, 0.99) * 1000,
        "answered_per_s": len(ok) / seconds,
        "generator_cpu_us": cpu / len(shots) * 1e6 if shots else float("nan"),
    }


# ---------------------------------------------------------------- the servers


@dataclass
class Row:
    """One way to the endpoint: its chat-completions URL, the key it takes, and the proxy's
    process (None: direct). ``url`` None: it could not run, and ``why`` says so."""

    name: str
    url: str | None
    key: str = "unused"
    pid: int | None = None
    why: str = ""
    rss: Callable[[], float] | None = None


def _log(logs: Path, name: str) -> Any:
    return open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed with the run's ExitStack


@dataclass(frozen=True)
class Endpoint:
    url: str  # its OpenAI base URL
    pid: int  # its process: on the direct row, its CPU per request is a bare ASGI app's under uvicorn


def start_endpoint(stack: contextlib.ExitStack, logs: Path) -> Endpoint:
    port = free_port()
    log = stack.enter_context(_log(logs, "endpoint"))
    proc = spawn([sys.executable, "-m", "benchmarks.overhead", "--serve", str(port)], stdout=log, stderr=log)
    stack.callback(stop, proc)
    wait_port(port, proc, "the instant endpoint")
    return Endpoint(f"http://127.0.0.1:{port}/v1", proc.pid)


@dataclass(frozen=True)
class CapmonRows:
    """What the capmon rows are run with (main's options)."""

    before: Path | None = None
    args: tuple[str, ...] = ()
    redis: str = REDIS_URL
    namespace: str = ""


def start_capmon(stack: contextlib.ExitStack, logs: Path, upstream: str, name: str, how: CapmonRows) -> Row:
    log = stack.enter_context(_log(logs, name))
    args = ["--access-log", str(logs / f"{name}.access.jsonl"), *how.args]
    tables, env = "", {}
    if name in ("capmon-redis", "capmon-w2"):
        tables = f'\n[shared]\nbackend = "redis"\nurl = "{how.redis}"\nnamespace = "{how.namespace}-{name}"\n'
        tables += "required = true\n"
    if name == "capmon-w2":
        args += ["--workers", "2"]
    if name == "capmon-uvloop":
        args += ["--loop", "uvloop"]
    if name == "capmon-before":
        if how.before is None:
            return Row(ROWS[name], None, why="no --before DIR")
        env = {"PYTHONPATH": str(how.before.resolve())}
    try:
        gw = start_gateway(upstream, CAPMON_SET, stderr=log, args=args, tables=tables, env=env)
    except RuntimeError as e:
        return Row(ROWS[name], None, why=str(e))
    stack.callback(gw.stop)
    pid = gw.proc.pid
    return Row(ROWS[name], gw.base_url + "/chat/completions", gw.key, pid, rss=lambda: _tree_rss(pid))


def _tree_rss(pid: int) -> float:
    return sum(rss_mb(p) for p in [pid, *descendants(pid)])


def forget_namespace(url: str, namespace: str) -> None:
    """The run's keys out of Redis (every row's namespace starts with ``namespace``)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2.0)
    try:
        keys = list(client.scan_iter(match=f"{namespace}-*", count=500))
        if keys:
            client.delete(*keys)
    except (redis.RedisError, OSError):
        pass
    finally:
        client.close()


def litellm_config(upstream: str) -> dict[str, Any]:
    """One model on the endpoint; the inner call never retries (the proxy's own policy only)."""
    params = {"model": f"openai/{MODEL}", "api_base": upstream, "api_key": "sk-capmon-sim-demo", "max_retries": 0}
    return {"model_list": [{"model_name": MODEL, "litellm_params": params}], "litellm_settings": {"telemetry": False}}


def start_litellm(stack: contextlib.ExitStack, logs: Path, upstream: str) -> Row:
    exe = Path(sys.executable).parent / "litellm"
    if not exe.exists():
        return Row(ROWS["litellm"], None, why="not installed (`pip install -e '.[bench]'`)")
    config = logs / "litellm.yaml"
    config.write_text(json.dumps(litellm_config(upstream), indent=1))  # JSON is YAML
    key = "sk-bench-" + secrets.token_hex(16)
    env = {"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    port = free_port()
    log = stack.enter_context(_log(logs, "litellm"))
    cmd = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    proc = spawn(cmd, env, stdout=log, stderr=log)
    stack.callback(stop, proc)
    try:
        wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc, "LiteLLM's proxy", timeout=180)
    except RuntimeError as e:
        lines = (logs / "litellm.log").read_text(errors="replace").strip().splitlines()
        return Row(ROWS["litellm"], None, why=f"{e}: {lines[-1] if lines else 'no output'}")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    return Row(ROWS["litellm"], url, key, proc.pid, rss=lambda: rss_mb(proc.pid))


def start_rows(
    names: Sequence[str], stack: contextlib.ExitStack, logs: Path, endpoint: Endpoint, how: CapmonRows
) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    upstream = endpoint.url
    for name in names:
        if name == "direct":
            # The endpoint's own CPU per request, on this row: what a bare ASGI app under
            # uvicorn costs, the server half of any Python proxy's floor.
            rows[name] = Row(ROWS[name], upstream + "/chat/completions", pid=endpoint.pid)
        elif name == "litellm":
            rows[name] = start_litellm(stack, logs, upstream)
        else:
            rows[name] = start_capmon(stack, logs, upstream, name, how)
    return rows


# ---------------------------------------------------------------- measuring


def run_generator(row: Row, rate: float, seconds: float, warmup: float, logs: Path) -> dict[str, Any]:
    """One measurement in a fresh generator process; the proxy's CPU per request beside it."""
    assert row.url is not None
    cmd = [sys.executable, "-m", "benchmarks.gateway", "--generate", row.url, "--rate", str(rate)]
    cmd += ["--seconds", str(seconds), "--warmup", str(warmup)]
    cpu0 = tree_cpu_seconds(row.pid) if row.pid else 0.0
    with open(logs / "generator.log", "a") as log:
        proc = spawn(cmd, {LOAD_KEY_ENV: row.key}, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            out, _ = proc.communicate(timeout=warmup + seconds + TIMEOUT + 60)
        finally:
            stop(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"the load generator failed (exit {proc.returncode}); see {logs / 'generator.log'}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if row.pid:
        result["proxy_cpu_us"] = (tree_cpu_seconds(row.pid) - cpu0) / result["sent_in_all"] * 1e6
    return result


def run_levels(rows: dict[str, Row], rates: Sequence[int], seconds: float, logs: Path) -> dict[int, dict[str, Any]]:
    """Every runnable row at every rate; the order of the rows rotates from rate to rate."""
    names = [n for n, r in rows.items() if r.url is not None]
    out: dict[int, dict[str, Any]] = {}
    for i, rate in enumerate(rates):
        out[rate] = {}
        for name in names[i % len(names) :] + names[: i % len(names)]:
            out[rate][name] = run_generator(rows[name], rate, seconds, WARMUP, logs)
            print(f"<!-- {rate}/s {rows[name].name}: {_brief(out[rate][name])} -->", flush=True)
            time.sleep(SETTLE)
    return out


def _brief(r: dict[str, Any]) -> str:
    return f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, {r['ok']} of {r['sent']} ok"


def run_soak(row: Row, seconds: float, logs: Path) -> dict[str, Any]:
    """``row`` (capmon serve) at SOAK_RATE for ``seconds``; its RSS and open file descriptors
    every SOAK_PERIOD seconds, the first before any load. The descriptors tell a leak from
    a high-water mark: memory that follows the number of connections comes back down
    with it, or stays at the most the pools ever held."""
    assert row.url is not None and row.rss is not None and row.pid is not None
    pid = row.pid

    def sample(t: float) -> tuple[float, float, int]:
        assert row.rss is not None
        return t, row.rss(), open_fds(pid)

    cmd = [sys.executable, "-m", "benchmarks.gateway", "--generate", row.url, "--rate", str(SOAK_RATE)]
    cmd += ["--seconds", str(seconds), "--warmup", "0"]
    samples = [sample(0.0)]
    with open(logs / "generator.log", "a") as log:
        proc = spawn(cmd, {LOAD_KEY_ENV: row.key}, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            t0 = time.monotonic()
            while proc.poll() is None:
                next_at = t0 + len(samples) * SOAK_PERIOD
                time.sleep(max(0.0, next_at - time.monotonic()))
                if proc.poll() is None:
                    samples.append(sample(time.monotonic() - t0))
            out = proc.stdout.read() if proc.stdout else ""
        finally:
            stop(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"the load generator failed (exit {proc.returncode}); see {logs / 'generator.log'}")
    return {"load": json.loads(out.strip().splitlines()[-1]), "rss": samples}


# ---------------------------------------------------------------- the report


def _ms(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"  # NaN (no answers) as "-"


def _errors(r: dict[str, Any]) -> str:
    errors: dict[str, int] = r["errors"]
    total = sum(errors.values())
    return f"{total} (" + ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) + ")" if total else "0"


LEVEL_HEAD = [
    "QPS",
    "row",
    "sent",
    "ok",
    "errors",
    "answered / s",
    "p50 ms",
    "p99 ms",
    "added p50 ms",
    "added p99 ms",
    "proxy CPU us / req",
    "generator CPU us / req",
    "generator lag p99 ms",
    "LiteLLM published p99 ms",
]


def levels_table(rows: dict[str, Row], results: dict[int, dict[str, Any]]) -> str:
    lines = []
    for rate, by_row in results.items():
        direct = by_row.get("direct")
        for name, row in rows.items():
            if name not in by_row:
                lines.append([str(rate), row.name, *["-"] * (len(LEVEL_HEAD) - 3), row.why])
                continue
            r = by_row[name]
            added = [
                _ms(r[k] - direct[k]) if direct is not None and name != "direct" else "-" for k in ("p50_ms", "p99_ms")
            ]
            cpu = f"{r['proxy_cpu_us']:.0f}" if "proxy_cpu_us" in r else "-"
            anchor = ANCHOR.get(rate, "") if name == "litellm" else ""
            lines.append(
                [
                    str(rate),
                    row.name,
                    str(r["sent"]),
                    str(r["ok"]),
                    _errors(r),
                    f"{r['answered_per_s']:.0f}",
                    _ms(r["p50_ms"]),
                    _ms(r["p99_ms"]),
                    *added,
                    cpu,
                    f"{r['generator_cpu_us']:.0f}",
                    _ms(r["lag_p99_ms"]),
                    anchor,
                ]
            )
    return markdown_table(LEVEL_HEAD, lines)


def _verdict(met: bool, value: str, by: str) -> str:
    return f"**met** ({value})" if met else f"missed by {by} ({value})"


CAPMON_ROWS = ("capmon", "capmon-redis", "capmon-w2", "capmon-uvloop", "capmon-before")


def _added_p99(by_row: dict[str, Any], name: str) -> float:
    return float(by_row[name]["p99_ms"] - by_row["direct"]["p99_ms"])


def goals(results: dict[int, dict[str, Any]]) -> list[str]:
    """capmon serve's rows against their latency, CPU and error goals, from the level figures."""
    out = []
    at, high = results.get(GOAL_ADDED_AT, {}), results.get(GOAL_CLEAN_AT, {})
    if "direct" in at and "proxy_cpu_us" in at["direct"]:
        server, client = at["direct"]["proxy_cpu_us"], at["direct"]["generator_cpu_us"]
        out.append(
            f"- the least a Python proxy costs here at {GOAL_ADDED_AT} QPS, for scale: a bare ASGI app under uvicorn "
            f"{server:.0f} us (the endpoint) + an aiohttp client {client:.0f} us (the generator) = "
            f"{server + client:.0f} us per request"
        )
    for name in CAPMON_ROWS:
        label = ROWS[name]
        if name in at and "direct" in at:
            gw, direct = at[name]["p99_ms"], at["direct"]["p99_ms"]
            added = gw - direct
            out.append(
                f"- {label}: p99 added <= {GOAL_ADDED_P99_MS:g} ms at {GOAL_ADDED_AT} QPS: "
                + _verdict(
                    added <= GOAL_ADDED_P99_MS,
                    f"{added:.2f} ms = {gw:.2f} - {direct:.2f}",
                    f"{added - GOAL_ADDED_P99_MS:.2f} ms",
                )
            )
        if name in at and "proxy_cpu_us" in at[name]:
            cpu = at[name]["proxy_cpu_us"]
            out.append(
                f"- {label}: CPU <= {GOAL_CPU_US:g} us per request at {GOAL_ADDED_AT} QPS: "
                + _verdict(cpu <= GOAL_CPU_US, f"{cpu:.0f} us", f"{cpu - GOAL_CPU_US:.0f} us")
            )
        if name in high and "direct" in high:
            added = _added_p99(high, name)
            out.append(
                f"- {label}: p99 added <= {GOAL_ADDED_P99_HIGH_MS:g} ms at {GOAL_CLEAN_AT:,} QPS: "
                + _verdict(
                    added <= GOAL_ADDED_P99_HIGH_MS, f"{added:.2f} ms", f"{added - GOAL_ADDED_P99_HIGH_MS:.2f} ms"
                )
            )
        if name in high:
            clean = high[name]
            errors = sum(clean["errors"].values())
            out.append(
                f"- {label}: {GOAL_CLEAN_AT:,} QPS with no errors: "
                + _verdict(
                    errors == 0,
                    f"{clean['ok']} of {clean['sent']} answered 200, {clean['answered_per_s']:.0f} / s",
                    f"{errors} errors: {_errors(clean)}",
                )
            )
    if not at:
        out.append(f"- at {GOAL_ADDED_AT} QPS: not measured (needs --rates {GOAL_ADDED_AT})")
    for a, b in (("capmon-w2", "capmon-redis"), ("capmon", "capmon-before"), ("capmon", "litellm")):
        pairs = []
        for rate, by_row in results.items():
            if {a, b, "direct"} <= by_row.keys():
                cpu = ""
                if "proxy_cpu_us" in by_row[a] and "proxy_cpu_us" in by_row[b]:
                    cpu = f", CPU {by_row[a]['proxy_cpu_us']:.0f} vs {by_row[b]['proxy_cpu_us']:.0f} us / req"
                pairs.append(f"{rate} QPS {_added_p99(by_row, a):.2f} vs {_added_p99(by_row, b):.2f} ms{cpu}")
        if pairs:
            out.append(f"- added p99, {ROWS[a]} vs {ROWS[b]}: " + "; ".join(pairs))
    return out


def _slope_per_min(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, MiB) points in MiB a minute; NaN for fewer than 3."""
    if len(points) < 3:
        return float("nan")
    return statistics.linear_regression(*zip(*points, strict=True)).slope * 60


def per_connection(samples: Sequence[tuple[float, float, int]]) -> tuple[float, float]:
    """RSS against open descriptors: (KiB per descriptor, the slope in MiB a minute of what
    is left of RSS once they are accounted for, from SOAK_SETTLED on). A leak shows in the
    second; memory that only follows the connections the pools hold does not."""
    fds, mbs = [float(f) for _, _, f in samples], [m for _, m, _ in samples]
    if len(set(fds)) < 2:
        return float("nan"), _slope_per_min([(t, m) for t, m, _ in samples if t >= SOAK_SETTLED])
    fit = statistics.linear_regression(fds, mbs)
    rest = [(t, m - fit.slope * f) for t, m, f in samples if t >= SOAK_SETTLED]
    return fit.slope * 1024, _slope_per_min(rest)


def soak_report(soak: dict[str, Any], seconds: float) -> list[str]:
    samples: list[tuple[float, float, int]] = soak["rss"]
    mbs = [m for _, m, _ in samples]
    fds = [f for _, _, f in samples]
    slope = _slope_per_min([(t, m) for t, m, _ in samples if t >= SOAK_SETTLED])
    kib_per_fd, rest_slope = per_connection(samples)
    load = soak["load"]
    per_request = slope * 1024 * 1024 / 60 / SOAK_RATE
    lines = [
        markdown_table(
            [
                "seconds",
                "QPS",
                "sent",
                "ok",
                "errors",
                "p50 ms",
                "p99 ms",
                "RSS MiB start / peak / end",
                "RSS slope",
                "open fds start / peak / end",
            ],
            [
                [
                    f"{seconds:g}",
                    str(SOAK_RATE),
                    str(load["sent"]),
                    str(load["ok"]),
                    _errors(load),
                    _ms(load["p50_ms"]),
                    _ms(load["p99_ms"]),
                    f"{mbs[0]:.1f} / {max(mbs):.1f} / {mbs[-1]:.1f}",
                    f"{slope:+.3f} MiB / min from {SOAK_SETTLED:g} s on",
                    f"{fds[0]} / {max(fds)} / {fds[-1]}",
                ]
            ],
        ),
        "",
        "RSS and open fds (s: MiB / fds): " + ", ".join(f"{t:.0f}: {m:.1f} / {f}" for t, m, f in samples),
        "",
        f"- RSS flat (slope from {SOAK_SETTLED:g} s on <= {GOAL_FLAT_MB_PER_MIN:g} MiB / min): "
        + (
            _verdict(
                slope <= GOAL_FLAT_MB_PER_MIN,
                f"{slope:+.3f} MiB / min, {per_request:+.1f} bytes / request",
                f"{slope - GOAL_FLAT_MB_PER_MIN:.3f} MiB / min",
            )
            if slope == slope
            else f"not judged: fewer than 3 samples after {SOAK_SETTLED:g} s (a soak of 600 s is the goal's)"
        ),
        f"- RSS against open descriptors (least squares): {kib_per_fd:.1f} KiB each; what is left once they are "
        f"accounted for grows {rest_slope:+.3f} MiB / min from {SOAK_SETTLED:g} s on",
    ]
    return lines


# ---------------------------------------------------------------- main


def _header(argv: Sequence[str]) -> str:
    from benchmarks.peers.litellm_router import _version  # the installed version, without importing LiteLLM

    command = "python -m benchmarks.gateway " + " ".join(shlex.quote(a) for a in argv)
    return (
        f"<!-- {command.strip()} -->\n"
        f"machine: {os.cpu_count()} cores shared with other work (read ratios, not absolute ms), "
        f"Python {platform.python_version()}; LiteLLM {_version()}; endpoint, proxies and load generator "
        f"each in a process of their own; open loop, latency from when a request was due; "
        f"percentiles over the 200 answers; timeout {TIMEOUT:g} s\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gateway", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", nargs="+", type=int, default=list(RATES), help="requests per second (100 500 1000)")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds per rate and row (30)")
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(DEFAULT_ROWS), help="which ways to go")
    ap.add_argument("--before", metavar="DIR", type=Path, help="a checkout of capmon for the capmon-before row")
    ap.add_argument(
        "--capmon-arg", action="append", default=[], metavar="ARG", help="more of capmon serve's arguments (repeatable)"
    )
    ap.add_argument("--redis", default=REDIS_URL, metavar="URL", help=f"the Redis of the Redis rows ({REDIS_URL})")
    ap.add_argument("--soak", type=float, metavar="SECONDS", help=f"capmon serve alone at {SOAK_RATE}/s, RSS sampled")
    ap.add_argument("--json", metavar="FILE", help="every figure, raw")
    ap.add_argument("--generate", metavar="URL", help=argparse.SUPPRESS)  # the load generator's process
    ap.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=float, default=WARMUP, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.generate:
        key = os.environ.get(LOAD_KEY_ENV, "unused")
        print(json.dumps(asyncio.run(generate(args.generate, key, args.rate, args.seconds, args.warmup))))
        return 0
    print(_header(argv if argv is not None else sys.argv[1:]), flush=True)
    logs = Path(tempfile.mkdtemp(prefix="capmon-gateway-bench-"))
    raw: dict[str, Any] = {}
    names = list(args.rows)
    if args.before is not None and "capmon-before" not in names:
        names.insert(1, "capmon-before")
    how = CapmonRows(args.before, tuple(args.capmon_arg), args.redis, f"capmon-bench-{secrets.token_hex(4)}")
    try:
        with contextlib.ExitStack() as stack:
            if any(n in ("capmon-redis", "capmon-w2") for n in names):
                stack.callback(forget_namespace, how.redis, how.namespace)
            upstream = start_endpoint(stack, logs)
            if args.soak:
                row = start_rows(["capmon"], stack, logs, upstream, how)["capmon"]
                if row.url is None:
                    raise RuntimeError(row.why)
                raw["soak"] = run_soak(row, args.soak, logs)
                print("\n".join(soak_report(raw["soak"], args.soak)))
            else:
                rows = start_rows(names, stack, logs, upstream, how)
                raw["levels"] = run_levels(rows, args.rates, args.seconds, logs)
                print()
                print(levels_table(rows, raw["levels"]))
                print()
                print("\n".join(goals(raw["levels"])))
    except KeyboardInterrupt:
        print(f"\ninterrupted: every process stopped; logs in {logs}", file=sys.stderr)
        return 130
    print(f"\n<!-- logs in {logs} -->")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
