"""What big request bodies cost ``capmon serve``: four 16 MiB ``/v1/messages`` bodies of tiny
text blocks (``{"type":"text","text":"a"}`` over and over in one user message, 621,375 of
them), sent at once, while ``/health`` is asked every few milliseconds.

    python -m benchmarks.big_bodies [--rows default limit raised] [--before DIR] [--embedded]
                                    [--size BYTES] [--requests N] [--json FILE]

Each row is a fresh ``capmon serve`` process (so its peak is this row's alone) on the
default config's four models (capmon/default_config.toml), on a simulator in a process of
its own (``--embedded``: in the gateway's process, as the default config runs it, so
what the simulator holds of the forwarded bodies counts too):

* ``default``: the gateway's limits as they ship: the 16 MiB body is refused (a 400 naming
  the limit), and what it costs to refuse it is measured;
* ``limit``: bodies of exactly ``[gateway] max_content_blocks`` tiny blocks (the default's
  20,000: 0.5 MiB), the most the default limits serve: the whole way through the gateway
  (checks, the prompt estimate, the translation for an OpenAI-wire model, the body sent);
* ``raised``: the 16 MiB body with the limits raised past its blocks, so it is served and
  the whole expansion is measured;
* ``before`` (with ``--before DIR``, another checkout of capmon: ``git archive REV capmon |
  tar -x -C DIR``): the 16 MiB body on that checkout's gateway, the same config.

What is measured, in this process: the gateway's peak resident memory (``VmHWM`` from
/proc, the kernel's own high-water mark, so no spike between samples is missed; its
``VmRSS`` before the bodies as the base), and ``/health``'s latency, asked over one
kept-alive connection every ``--poll-ms`` from a thread of its own: for two seconds
before the bodies (``idle``: what the machine itself adds, on 2 shared cores), then while
they are sent, read and answered. Goals: peak under 300 MB in all, and every ``/health``
within 100 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.ideal import percentile
from benchmarks.peers.capmon_gateway import BANNER
from benchmarks.procs import ROOT, free_port, markdown_table, read_line, spawn, start_simulator, stop
from capmon.core.types.config import GatewayConfig

SIZE = 16 * 1024 * 1024  # the gateway's default max_body_bytes
REQUESTS = 4
BLOCK = b'{"type":"text","text":"a"}'
POLL_MS = 5.0
SCENARIO = "steady"  # ample capacity on every model: the answer is not what is measured
GOAL_PEAK_MB = 300.0
GOAL_HEALTH_MS = 100.0
IDLE = 2.0  # seconds of /health before the bodies
ROWS = ("before", "default", "limit", "raised")
# Past any body of --size: the raised row serves what the default row refuses.
RAISED = "max_messages = 10000000\nmax_content_blocks = 10000000\nmax_tools = 10000000\n"


_HEAD = b'{"model":"auto","max_tokens":16,"messages":[{"role":"user","content":['
_TAIL = b"]}]}"


def tiny_blocks(size: int) -> bytes:
    """A Messages body of at most ``size`` bytes: one user message of as many tiny text
    blocks as fit."""
    return blocks_body((size - len(_HEAD) - len(_TAIL) + 1) // (len(BLOCK) + 1))


def blocks_body(n: int) -> bytes:
    """A Messages body of one user message of ``n`` tiny text blocks."""
    return _HEAD + b",".join([BLOCK] * n) + _TAIL


def config_text(sim_port: int, embedded: bool, gateway: str) -> str:
    """The default config on the simulator at ``sim_port`` (steady capacity), with a
    ``[gateway]`` table of ``gateway``'s lines."""
    text = (ROOT / "capmon" / "default_config.toml").read_text(encoding="utf-8")
    text = text.replace("127.0.0.1:8089", f"127.0.0.1:{sim_port}").replace('"demo"', f'"{SCENARIO}"')
    if not embedded:
        text = text.replace("enabled = true", "enabled = false", 1)
    return text + f"\n[gateway]\n{gateway}"


# ---------------------------------------------------------------- watching the gateway


def _status_mb(pid: int, name: str) -> float:
    """A memory figure of /proc/PID/status (VmRSS, VmHWM) in MB (10^6 bytes, as the goal)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no {name} for process {pid}")


@dataclass
class HealthPoller:
    """``GET /health`` every ``period`` seconds on one kept-alive connection, from a thread;
    each answer's latency (a failure counts as the time it took to fail)."""

    port: int
    period: float
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/health")
                r = conn.getresponse()
                r.read()
                ok = r.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            self.latencies.append(time.perf_counter() - t0)
            self.failures += not ok
            self._stop.wait(self.period)
        conn.close()


def send(port: int, body: bytes, out: list[tuple[int, str]], i: int) -> None:
    """POST ``body`` to /v1/messages; its status and the start of its answer in ``out[i]``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request(
            "POST",
            "/v1/messages",
            body=body,
            headers={"content-type": "application/json", "x-api-key": "unused", "anthropic-version": "2023-06-01"},
        )
        r = conn.getresponse()
        out[i] = (r.status, r.read()[:300].decode("utf-8", "replace"))
    except (OSError, http.client.HTTPException) as e:
        out[i] = (0, f"{type(e).__name__}: {e}")
    finally:
        conn.close()


# ---------------------------------------------------------------- one row


@dataclass
class Gateway:
    proc: subprocess.Popen[str]
    port: int


def start_gateway(config: Path, log: Any, env: dict[str, str]) -> Gateway:
    # -P: the working directory (this checkout) is not put first on sys.path, so the
    # before row's PYTHONPATH (another checkout) is the capmon imported
    cmd = [sys.executable, "-P", "-m", "capmon.cli", "serve", "--config", str(config), "--listen", "127.0.0.1:0"]
    proc = spawn(cmd, env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
    banner = read_line(proc, 60.0)
    found = BANNER.search(banner)
    if found is None:
        stop(proc)
        raise RuntimeError(f"capmon serve did not start (exit {proc.poll()}): {banner or 'no banner'}")
    return Gateway(proc, int(found.group(1)))


def run_row(name: str, body: bytes, args: argparse.Namespace, logs: Path, sim_port: int) -> dict[str, Any]:
    """One row: a fresh gateway, ``/health`` alone, then ``args.requests`` x ``body`` at once."""
    embedded = args.embedded
    port = free_port() if embedded else sim_port
    config = logs / f"{name}.toml"
    config.write_text(config_text(port, embedded, RAISED if name == "raised" else ""), encoding="utf-8")
    env = {"PYTHONPATH": str(args.before.resolve())} if name == "before" else {}
    with open(logs / f"{name}.log", "w") as log:
        gw = start_gateway(config, log, env)
    try:
        time.sleep(1.0)  # past start-up's own allocations
        base_mb = _status_mb(gw.proc.pid, "VmRSS")
        poller = HealthPoller(gw.port, args.poll_ms / 1000)
        poller.start()
        time.sleep(IDLE)
        idle = list(poller.latencies)
        answers: list[tuple[int, str]] = [(0, "")] * args.requests
        senders = [
            threading.Thread(target=send, args=(gw.port, body, answers, i), daemon=True) for i in range(args.requests)
        ]
        t0 = time.perf_counter()
        for s in senders:
            s.start()
        for s in senders:
            s.join()
        wall = time.perf_counter() - t0
        time.sleep(0.2)
        poller.stop()
        peak_mb = _status_mb(gw.proc.pid, "VmHWM")
        end_mb = _status_mb(gw.proc.pid, "VmRSS")
    finally:
        stop(gw.proc)
    lat = poller.latencies[len(idle) :]
    return {
        "row": name,
        "blocks": body.count(BLOCK),
        "body_mib": len(body) / 2**20,
        "idle_health_p99_ms": percentile(idle, 0.99) * 1000,
        "idle_health_max_ms": max(idle) * 1000 if idle else float("nan"),
        "statuses": [s for s, _ in answers],
        "answers": [a for _, a in answers],
        "base_mb": base_mb,
        "peak_mb": peak_mb,
        "end_mb": end_mb,
        "wall_s": wall,
        "health_n": len(lat),
        "health_failures": poller.failures,
        "health_p50_ms": percentile(lat, 0.50) * 1000,
        "health_p99_ms": percentile(lat, 0.99) * 1000,
        "health_max_ms": max(lat) * 1000 if lat else float("nan"),
    }


# ---------------------------------------------------------------- the report


def _statuses(statuses: Sequence[int]) -> str:
    counts: dict[int, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} x {s}" for s, n in sorted(counts.items()))


def report(results: Sequence[dict[str, Any]], requests: int) -> str:
    head = ["row", "blocks each", "MiB each", "answers", "RSS before MB", "peak RSS MB", "peak - before MB"]
    head += ["after MB", "wall s", "/health idle p99 / max ms", "/health p50 / p99 / max ms", "/health asked"]
    rows = [
        [
            r["row"],
            f"{r['blocks']:,}",
            f"{r['body_mib']:.1f}",
            _statuses(r["statuses"]),
            f"{r['base_mb']:.0f}",
            f"{r['peak_mb']:.0f}",
            f"{r['peak_mb'] - r['base_mb']:.0f}",
            f"{r['end_mb']:.0f}",
            f"{r['wall_s']:.1f}",
            f"{r['idle_health_p99_ms']:.1f} / {r['idle_health_max_ms']:.1f}",
            f"{r['health_p50_ms']:.1f} / {r['health_p99_ms']:.1f} / {r['health_max_ms']:.1f}",
            f"{r['health_n']}" + (f" ({r['health_failures']} failed)" if r["health_failures"] else ""),
        ]
        for r in results
    ]
    lines = [f"{requests} bodies at once per row\n", markdown_table(head, rows), ""]
    for r in results:
        per = (r["peak_mb"] - r["base_mb"]) / (r["body_mib"] * 2**20 / 1e6) / requests  # MB over MB
        peak_ok = r["peak_mb"] < GOAL_PEAK_MB
        health_ok = r["health_max_ms"] <= GOAL_HEALTH_MS and not r["health_failures"]
        lines.append(
            f"{r['row']}: peak {r['peak_mb']:.0f} MB ({'met' if peak_ok else 'missed'}: < {GOAL_PEAK_MB:.0f} MB), "
            f"{per:.1f} x the body per request over the base; worst /health {r['health_max_ms']:.0f} ms "
            f"({'met' if health_ok else 'missed'}: <= {GOAL_HEALTH_MS:.0f} ms); first answer: {r['answers'][0][:160]!r}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.big_bodies", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=["default", "limit", "raised"], help="which gateways")
    ap.add_argument("--before", metavar="DIR", type=Path, help="a checkout of capmon for the before row")
    ap.add_argument("--embedded", action="store_true", help="the simulator in the gateway's process")
    ap.add_argument("--size", type=int, default=SIZE, help=f"bytes per body ({SIZE})")
    ap.add_argument("--requests", type=int, default=REQUESTS, help=f"bodies sent at once ({REQUESTS})")
    ap.add_argument("--poll-ms", type=float, default=POLL_MS, help=f"ms between /health asks ({POLL_MS:g})")
    ap.add_argument("--json", metavar="FILE", help="every figure, raw")
    args = ap.parse_args(argv)
    names = list(args.rows)
    if args.before is not None and "before" not in names:
        names.insert(0, "before")
    if "before" in names and args.before is None:
        ap.error("the before row needs --before DIR")
    command = "python -m benchmarks.big_bodies " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    print(f"<!-- {command.strip()} -->")
    print(
        f"machine: {os.cpu_count()} cores shared with other work, Python {platform.python_version()}; "
        f"simulator {'in the gateway process' if args.embedded else 'in a process of its own'}\n",
        flush=True,
    )
    big = tiny_blocks(args.size)
    at_limit = blocks_body(GatewayConfig().max_content_blocks)
    logs = Path(tempfile.mkdtemp(prefix="capmon-big-bodies-"))
    results = []
    with contextlib.ExitStack() as stack:
        sim_port = free_port()
        if not args.embedded:
            sim = start_simulator(sim_port, SCENARIO, logs / "sim.log")
            stack.callback(stop, sim)
        for name in names:
            results.append(run_row(name, at_limit if name == "limit" else big, args, logs, sim_port))
            print(f"{name}: done", flush=True)
    print(report(results, args.requests))
    print(f"\nlogs: {logs}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
