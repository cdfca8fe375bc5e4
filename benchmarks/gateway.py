"""The gateway's added latency: ``capmon serve``, LiteLLM's proxy, Portkey's gateway and
TensorZero's against direct calls to an endpoint that answers at once, under open-loop
load, in one run.

    python -m benchmarks.gateway [--rates 100 500 1000] [--seconds 30] [--rows direct capmon ... tensorzero]
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
* Portkey's open-source gateway (``@portkey-ai/gateway`` from npm, under node): installed
  once into a cache outside the repository (``$CAPMON_BENCH_CACHE``, else
  ~/.cache/capmon-bench, ``portkey/``), its dependencies pinned to the versions of its own
  lockfile (PORTKEY_PINS: with today's releases its streams break); configured per request
  by its ``x-portkey-config`` header (provider openai, the endpoint as its custom host).
  Its server passes no host to ``listen``, so a preloaded line makes that 127.0.0.1;
* TensorZero's gateway (Rust), from its PyPI wheel (``tensorzero``): the wheel has no
  gateway binary, but its extension module starts the gateway's HTTP server in process
  (``tensorzero._start_http_gateway``, what ``patch_openai_client`` runs: the
  OpenAI-compatible routes on 127.0.0.1 and a port of its own), here in a Python process
  that does nothing else (``--tensorzero``); its config (``tensorzero.toml`` in the run's
  log directory) has one model on the endpoint (``type = "openai"``, ``api_base``) and
  observability off (no ClickHouse), and the model is called as
  ``tensorzero::model_name::sim-flagship`` on ``/openai/v1/chat/completions``. Portkey's and
  TensorZero's rows are first sent one request and one stream; a row that does not answer
  both says so in its row and is not measured;
* the load generator, a fresh process per measurement: aiohttp in an open loop. Request i
  is due at t0 + i / rate and is sent then, whatever the earlier ones are doing; its
  latency runs from when it was due to its answer, so queueing anywhere (the generator,
  the kernel, the proxy) counts. Errors: a status other than 200, a 200 that is not a
  chat completion, no answer within 10 s (timeout), a connection error.

For each rate the rows are measured in turn, the order rotated from rate to rate so that
drift on a shared machine does not always fall on the same row: a 2 s warm-up at the
rate (not counted), then ``--seconds`` at the rate. Before each measurement the benchmark
waits until the row measured before it is quiet: its process tree and the endpoint's use
under 5 % of a core over 1 s (at most 90 s; before the first, every server's start-up),
and prints how long that took. A proxy that fell behind keeps working off its backlog
after its load stops (LiteLLM's for 20-45 s), and that work would land on the next row.
"Added" is a proxy's percentile minus
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
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
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
    wait_quiet,
    wait_until,
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
    "portkey": "Portkey gateway",
    "tensorzero": "TensorZero gateway",
}
DEFAULT_ROWS = ("direct", "capmon", "capmon-redis", "capmon-w2", "litellm", "portkey", "tensorzero")
REDIS_URL = "redis://127.0.0.1:6379/15"
MODEL = "sim-flagship"  # a model of capmon-bench.toml; LiteLLM's one model has the same name
UPSTREAM_KEY = "sk-capmon-sim-demo"  # what a proxy sends the endpoint (which takes any)
TIMEOUT = 10.0  # seconds: a request not answered by then is a timeout
MAX_OPEN = 1000  # connections the generator may hold; past them requests wait for one (and count it)
WARMUP = 2.0  # seconds at the rate before each measurement, not counted
# Quiet before a measurement: the last row's process tree and the endpoint's under this
# share of a core over the window, or the cap passed.
QUIET_SHARE, QUIET_WINDOW, QUIET_CAP = 0.05, 1.0, 90.0
LOAD_KEY_ENV = "CAPMON_BENCH_LOAD_KEY"  # the key the generator sends (from the environment: never in ps)
LOAD_HEADERS_ENV = "CAPMON_BENCH_LOAD_HEADERS"  # more headers it sends, a JSON object (Portkey's config)
CACHE_ENV = "CAPMON_BENCH_CACHE"  # where downloaded peers are installed (default ~/.cache/capmon-bench)
PORTKEY_VERSION = "1.15.2"  # @portkey-ai/gateway, the latest release when this row was added
# Its direct dependencies at the versions of its own lockfile (package-lock.json at the tag
# v1.15.2 of github.com/Portkey-AI/gateway), as npm overrides: the npm package ships no
# lockfile, and with the releases its ranges take today (@hono/node-server 1.19, hono 4.13)
# every streamed answer fails ("TypeError: immutable" when it sets a header; the client gets
# {"status":"failure","message":"Something went wrong"}).
PORTKEY_PINS = {
    "@aws-crypto/sha256-js": "5.2.0",
    "@cfworker/json-schema": "4.0.3",
    "@hono/node-server": "1.13.5",
    "@hono/node-ws": "1.2.0",
    "@portkey-ai/mustache": "2.1.3",
    "@smithy/signature-v4": "2.1.1",
    "@types/mustache": "4.2.5",
    "async-retry": "1.3.3",
    "avsc": "5.7.7",
    "hono": "4.9.7",
    "ioredis": "5.8.0",
    "jose": "6.0.11",
    "patch-package": "8.0.1",
    "ws": "8.18.3",
    "zod": "3.25.76",
}
# Portkey's server calls listen(port, undefined): every interface. This makes it 127.0.0.1.
PORTKEY_LOOPBACK_JS = """\
const net = require("node:net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (port, host, ...rest) {
  if (typeof port === "number" && host === undefined) host = "127.0.0.1";
  return listen.call(this, port, host, ...rest);
};
"""
TENSORZERO_MODEL = f"tensorzero::model_name::{MODEL}"  # its OpenAI-compatible name for a model of its config
TENSORZERO_KEY_ENV = "CAPMON_BENCH_UPSTREAM_KEY"  # the key TensorZero sends the endpoint
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
# Issue 30: capmon serve within 2x of TensorZero's CPU per request, and at or under its added p99.
GOAL_TENSORZERO_CPU_X = 2.0
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


def request_body(model: str = MODEL, stream: bool = False) -> bytes:
    """The one request every row is sent: a short chat completion of ``model``."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 16}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


async def generate(
    url: str,
    key: str,
    rate: float,
    seconds: float,
    warmup: float,
    model: str = MODEL,
    more: dict[str, str] | None = None,
) -> dict[str, Any]:
    import aiohttp

    loop = asyncio.get_running_loop()
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}", **(more or {})}
    body = request_body(model)
    connector = aiohttp.TCPConnector(limit=MAX_OPEN)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session:

        async def send(due: float) -> Shot:
            sent = loop.time()
            try:
                async with session.post(url, data=body, headers=headers) as r:
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
    process (None: direct). ``url`` None: it could not run, and ``why`` says so. ``model``
    is the model the request names there; ``headers`` more headers each request carries."""

    name: str
    url: str | None
    key: str = "unused"
    pid: int | None = None
    why: str = ""
    rss: Callable[[], float] | None = None
    model: str = MODEL
    headers: dict[str, str] = field(default_factory=dict)


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
    params = {"model": f"openai/{MODEL}", "api_base": upstream, "api_key": UPSTREAM_KEY, "max_retries": 0}
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
        return Row(ROWS["litellm"], None, why=f"{e}: {_last_line(logs / 'litellm.log')}")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    return Row(ROWS["litellm"], url, key, proc.pid, rss=lambda: rss_mb(proc.pid))


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1].strip()[:300] if lines else "no output"


def smoke(row: Row) -> str:
    """What is wrong with ``row``, in one line: "" when it answers one request with a chat
    completion and one stream with chunks and ``data: [DONE]``."""
    assert row.url is not None
    headers = {"content-type": "application/json", "authorization": f"Bearer {row.key}", **row.headers}
    for stream in (False, True):
        what = "a stream" if stream else "a request"
        request = urllib.request.Request(row.url, data=request_body(row.model, stream), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
                answer = r.read()
        except urllib.error.HTTPError as e:
            return f"{what} got HTTP {e.code}: {e.read()[:200].decode(errors='replace')}"
        except OSError as e:
            return f"{what} failed: {e}"
        if stream:
            ok = b'"chat.completion.chunk"' in answer and answer.rstrip().endswith(b"data: [DONE]")
        else:
            ok = _outcome(200, answer) == "ok"
        if not ok:
            return f"{what} came back broken: {answer[:200].decode(errors='replace')!r}"
    return ""


def _checked(row: Row) -> Row:
    why = smoke(row)
    return Row(row.name, None, why=why) if why else row


def cache_dir() -> Path:
    """Where downloaded peers are installed, outside the repository, kept between runs."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "capmon-bench"


def portkey_manifest() -> str:
    """The package.json of Portkey's install: the release, and its lockfile's versions."""
    manifest = {"private": True, "dependencies": {"@portkey-ai/gateway": PORTKEY_VERSION}, "overrides": PORTKEY_PINS}
    return json.dumps(manifest, indent=1) + "\n"


def install_portkey(npm: str, logs: Path) -> Path:
    """Portkey's gateway in the cache (npm install, once per manifest); its server's
    script. RuntimeError: why it could not be installed, in one line."""
    home = cache_dir() / "portkey"
    script = home / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    manifest = portkey_manifest()
    stamp = home / ".capmon-bench-installed"  # the manifest it was installed from
    if script.exists() and stamp.exists() and stamp.read_text() == manifest:
        return script
    home.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    (home / "package-lock.json").unlink(missing_ok=True)  # resolved anew from the manifest
    (home / "package.json").write_text(manifest)
    # --ignore-scripts: its one install script is patch-package, and the package ships no patches.
    cmd = [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--omit=dev"]
    print(f"<!-- installing Portkey's gateway {PORTKEY_VERSION} into {home} -->", flush=True)
    npm_log = logs / "portkey-npm.log"
    with open(npm_log, "w") as log:
        try:
            done = subprocess.run(cmd, cwd=home, stdout=log, stderr=subprocess.STDOUT, timeout=600)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"npm install did not finish within 600 s (see {npm_log})") from None
    if done.returncode != 0 or not script.exists():
        raise RuntimeError(f"npm install failed (exit {done.returncode}): {_last_line(npm_log)}")
    stamp.write_text(manifest)
    return script


def node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "not installed"
    try:
        return subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def start_portkey(stack: contextlib.ExitStack, logs: Path, upstream: str) -> Row:
    label = ROWS["portkey"]
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return Row(label, None, why=f"needs node (20) and npm: {'node' if node is None else 'npm'} is not on PATH")
    try:
        script = install_portkey(npm, logs)
    except RuntimeError as e:
        return Row(label, None, why=str(e))
    preload = logs / "portkey-loopback.cjs"
    preload.write_text(PORTKEY_LOOPBACK_JS)
    port = free_port()
    log = stack.enter_context(_log(logs, "portkey"))
    proc = spawn([node, "--require", str(preload), str(script), f"--port={port}", "--headless"], stdout=log, stderr=log)
    stack.callback(stop, proc)
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc, "Portkey's gateway", timeout=60)
    except RuntimeError as e:
        return Row(label, None, why=f"{e}: {_last_line(logs / 'portkey.log')}")
    config = {"provider": "openai", "custom_host": upstream, "api_key": UPSTREAM_KEY}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    headers = {"x-portkey-config": json.dumps(config)}
    return _checked(Row(label, url, pid=proc.pid, rss=lambda: rss_mb(proc.pid), headers=headers))


def tensorzero_config(upstream: str) -> str:
    """One model on the endpoint, as an OpenAI-compatible provider; observability off."""
    return (
        "# benchmarks/gateway.py: one model on the instant endpoint; no ClickHouse\n"
        "[gateway]\nobservability.enabled = false\n\n"
        f'[models.{MODEL}]\nrouting = ["instant"]\n\n'
        f"[models.{MODEL}.providers.instant]\n"
        f'type = "openai"\napi_base = "{upstream}"\nmodel_name = "{MODEL}"\n'
        f'api_key_location = "env::{TENSORZERO_KEY_ENV}"\n'
    )


def serve_tensorzero(config: str, url_file: str) -> None:
    """TensorZero's gateway over HTTP from its wheel, in this process until it is stopped:
    the extension module's ``_start_http_gateway`` (what ``patch_openai_client`` starts:
    its Rust HTTP server with the OpenAI-compatible routes, on 127.0.0.1 and a free port,
    in the module's tokio runtime); its base URL is written to ``url_file``."""
    tensorzero = importlib.import_module("tensorzero")
    gateway = tensorzero._start_http_gateway(
        config_file=config, clickhouse_url=None, postgres_url=None, valkey_url=None, async_setup=False
    )
    written = Path(url_file + ".part")
    written.write_text(gateway.base_url)
    written.replace(url_file)
    threading.Event().wait()  # the gateway runs on the runtime's threads; SIGTERM ends it all


def start_tensorzero(stack: contextlib.ExitStack, logs: Path, upstream: str) -> Row:
    label = ROWS["tensorzero"]
    if importlib.util.find_spec("tensorzero") is None:
        return Row(label, None, why="not installed (`pip install -e '.[bench]'`)")
    config, url_file = logs / "tensorzero.toml", logs / "tensorzero.url"
    config.write_text(tensorzero_config(upstream))
    log = stack.enter_context(_log(logs, "tensorzero"))
    cmd = [sys.executable, "-m", "benchmarks.gateway", "--tensorzero", str(config), str(url_file)]
    proc = spawn(cmd, {TENSORZERO_KEY_ENV: UPSTREAM_KEY}, stdout=log, stderr=log)
    stack.callback(stop, proc)
    try:
        wait_until(url_file.exists, proc, "TensorZero's gateway", timeout=60)
    except RuntimeError as e:
        return Row(label, None, why=f"{e}: {_last_line(logs / 'tensorzero.log')}")
    url = url_file.read_text().strip() + "/chat/completions"
    row = Row(label, url, pid=proc.pid, rss=lambda: rss_mb(proc.pid), model=TENSORZERO_MODEL)
    return _checked(row)


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
        elif name == "portkey":
            rows[name] = start_portkey(stack, logs, upstream)
        elif name == "tensorzero":
            rows[name] = start_tensorzero(stack, logs, upstream)
        else:
            rows[name] = start_capmon(stack, logs, upstream, name, how)
    return rows


# ---------------------------------------------------------------- measuring


def _generator(row: Row, rate: float, seconds: float, warmup: float) -> tuple[list[str], dict[str, str]]:
    """The load generator's command and environment for ``row`` (the key and headers in
    the environment, never in ps)."""
    assert row.url is not None
    cmd = [sys.executable, "-m", "benchmarks.gateway", "--generate", row.url, "--rate", str(rate)]
    cmd += ["--seconds", str(seconds), "--warmup", str(warmup), "--model", row.model]
    return cmd, {LOAD_KEY_ENV: row.key, LOAD_HEADERS_ENV: json.dumps(row.headers)}


def run_generator(row: Row, rate: float, seconds: float, warmup: float, logs: Path) -> dict[str, Any]:
    """One measurement in a fresh generator process; the proxy's CPU per request beside it."""
    cmd, env = _generator(row, rate, seconds, warmup)
    cpu0 = tree_cpu_seconds(row.pid) if row.pid else 0.0
    with open(logs / "generator.log", "a") as log:
        proc = spawn(cmd, env, stdout=subprocess.PIPE, stderr=log, text=True)
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


def run_levels(
    rows: dict[str, Row], rates: Sequence[int], seconds: float, logs: Path, endpoint: int
) -> dict[int, dict[str, Any]]:
    """Every runnable row at every rate; the order of the rows rotates from rate to rate.
    Each measurement waits until the row measured before it (and the endpoint, ``endpoint``)
    is quiet; the first, until every server is done starting."""
    names = [n for n, r in rows.items() if r.url is not None]
    out: dict[int, dict[str, Any]] = {}
    last = "every server's start-up"
    busy = {endpoint, *(r.pid for r in rows.values() if r.pid is not None)}
    for i, rate in enumerate(rates):
        out[rate] = {}
        for name in names[i % len(names) :] + names[: i % len(names)]:
            waited, share = wait_quiet(sorted(busy), QUIET_SHARE, QUIET_WINDOW, QUIET_CAP)
            print(f"<!-- {rate}/s {rows[name].name}: {_quiet(last, waited, share)} -->", flush=True)
            result = run_generator(rows[name], rate, seconds, WARMUP, logs)
            result["quiet"] = {"after": last, "waited_s": waited, "core_share": share}
            out[rate][name] = result
            print(f"<!-- {rate}/s {rows[name].name}: {_brief(result)} -->", flush=True)
            last, busy = rows[name].name, {endpoint, rows[name].pid or endpoint}
    return out


def _quiet(after: str, waited: float, share: float) -> str:
    use = f"{share:.0%} of a core over the last {QUIET_WINDOW:g} s"
    if share < QUIET_SHARE:
        return f"waited {waited:.1f} s for {after} to go quiet ({use})"
    return f"{after} not quiet after {waited:.1f} s ({use}): measured anyway"


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

    cmd, env = _generator(row, SOAK_RATE, seconds, 0.0)
    samples = [sample(0.0)]
    with open(logs / "generator.log", "a") as log:
        proc = spawn(cmd, env, stdout=subprocess.PIPE, stderr=log, text=True)
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
    pairs_of = [("capmon-w2", "capmon-redis"), ("capmon", "capmon-before")]
    pairs_of += [("capmon", peer) for peer in ("litellm", "portkey", "tensorzero")]
    for a, b in pairs_of:
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


def peer_goals(rows: dict[str, Row], results: dict[int, dict[str, Any]]) -> list[str]:
    """Issue 30's goal at every rate measured, for each capmon row: CPU per request within
    GOAL_TENSORZERO_CPU_X of TensorZero's, and added p99 at or under TensorZero's; and the
    CPU per request beside Portkey's."""
    out = []
    for peer in ("tensorzero", "portkey"):
        row = rows.get(peer)
        if row is not None and row.url is None:
            out.append(f"- against {row.name}: not judged, its row did not run ({row.why})")
    for rate, by_row in results.items():
        tz, pk = by_row.get("tensorzero"), by_row.get("portkey")
        for name in CAPMON_ROWS:
            if name not in by_row:
                continue
            me, label = by_row[name], ROWS[name]
            if tz is not None and "proxy_cpu_us" in me and "proxy_cpu_us" in tz:
                x = me["proxy_cpu_us"] / tz["proxy_cpu_us"]
                out.append(
                    f"- {label}: CPU within {GOAL_TENSORZERO_CPU_X:g}x TensorZero's at {rate:,} QPS: "
                    + _verdict(
                        x <= GOAL_TENSORZERO_CPU_X,
                        f"{x:.2f}x: {me['proxy_cpu_us']:.0f} vs {tz['proxy_cpu_us']:.0f} us / req",
                        f"{x - GOAL_TENSORZERO_CPU_X:.2f}x",
                    )
                )
            if tz is not None and "direct" in by_row:
                mine, theirs = _added_p99(by_row, name), _added_p99(by_row, "tensorzero")
                out.append(
                    f"- {label}: added p99 at or under TensorZero's at {rate:,} QPS: "
                    + _verdict(mine <= theirs, f"{mine:.2f} vs {theirs:.2f} ms", f"{mine - theirs:.2f} ms")
                )
            if pk is not None and "proxy_cpu_us" in me and "proxy_cpu_us" in pk:
                x = me["proxy_cpu_us"] / pk["proxy_cpu_us"]
                added = ""
                if "direct" in by_row:
                    added = f"; added p99 {_added_p99(by_row, name):.2f} vs {_added_p99(by_row, 'portkey'):.2f} ms"
                out.append(
                    f"- {label}: CPU per request {x:.2f}x Portkey's at {rate:,} QPS "
                    f"({me['proxy_cpu_us']:.0f} vs {pk['proxy_cpu_us']:.0f} us{added})"
                )
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


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _header(argv: Sequence[str]) -> str:
    command = "python -m benchmarks.gateway " + " ".join(shlex.quote(a) for a in argv)
    pins = ", ".join(f"{k} {PORTKEY_PINS[k]}" for k in ("hono", "@hono/node-server"))
    return (
        f"<!-- {command.strip()} -->\n"
        f"machine: {os.cpu_count()} cores shared with other work (read ratios, not absolute ms), "
        f"Python {platform.python_version()}; LiteLLM {_installed('litellm')}; "
        f"Portkey gateway {PORTKEY_VERSION} ({pins}: its lockfile's) on node {node_version()}; "
        f"TensorZero {_installed('tensorzero')}; endpoint, proxies and load generator "
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
    ap.add_argument("--model", default=MODEL, help=argparse.SUPPRESS)
    ap.add_argument("--tensorzero", nargs=2, metavar=("CONFIG", "URL_FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.generate:
        key = os.environ.get(LOAD_KEY_ENV, "unused")
        more = json.loads(os.environ.get(LOAD_HEADERS_ENV) or "{}")
        load = generate(args.generate, key, args.rate, args.seconds, args.warmup, args.model, more)
        print(json.dumps(asyncio.run(load)))
        return 0
    if args.tensorzero:
        serve_tensorzero(*args.tensorzero)
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
                raw["levels"] = run_levels(rows, args.rates, args.seconds, logs, upstream.pid)
                print()
                print(levels_table(rows, raw["levels"]))
                print()
                print("\n".join(goals(raw["levels"]) + peer_goals(rows, raw["levels"])))
    except KeyboardInterrupt:
        print(f"\ninterrupted: every process stopped; logs in {logs}", file=sys.stderr)
        return 130
    print(f"\n<!-- logs in {logs} -->")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
