"""``capmon serve --workers 2``: two real processes on one port (SO_REUSEPORT) acting as
one client through a real Redis. Both serve (every reply names its worker), a trip
through one is seen through the other, ``/metrics`` from either adds up both, SIGTERM
stops both; a worker killed under load is restarted while the other serves on, a
worker that keeps dying stops the gateway, SIGTERM during a restart stops everything;
and more than one worker without ``[shared]`` Redis is one line, exit 2."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx
import pytest

from capmon.cli import main
from capmon.gateway.workers import CRASH_LOOP, Deaths
from tests.fleet.conftest import namespace, redis_url  # noqa: F401  (fixtures: a real Redis, a namespace of our own)
from tests.gateway.test_serve import FAST, _shipped_config
from tests.support.configs import shipped_config

ADMIN = "sk-workers-test-admin-0123456789"
BANNER = re.compile(r"listening on http://127\.0\.0\.1:(\d+)/v1 .*; 2 workers, pids (\d+), (\d+);")
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 8}
# The shipped models, claude too (requests in parallel reach it), each answer in half a
# second: many requests in flight at a rate that leaves the cores to a restarting worker.
SCENARIO = (
    'name = "half-a-second"\n'
    + FAST.replace("base_latency = 0.05", "base_latency = 0.5")
    + """
[[models]]
name = "sim-claude"
api = "anthropic"
slots = 64
base_latency = 0.5
per_token = 0.0002
noise = 0.0
answer_tokens = 40
context_window = 200000
"""
)


def _config(tmp_path: Path, url: str, ns: str) -> Path:
    path = shipped_config(tmp_path, SCENARIO)[0]
    text = path.read_text()
    assert "[shared]" not in text and "[gateway]" not in text
    path.write_text(
        text + f'\n[shared]\nbackend = "redis"\nurl = "{url}"\nnamespace = "{ns}"\nreconcile = 0.2\n'
        '\n[gateway]\nadmin_key_env = "CAPMON_WORKERS_ADMIN"\n'
    )
    return path


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CAPMON_")}, "CAPMON_WORKERS_ADMIN": ADMIN}


def _fresh(origin: str, method: str, path: str, **kw: object) -> httpx.Response:
    """One request on a connection of its own: the kernel picks the worker per connection."""
    with httpx.Client(base_url=origin, trust_env=False, timeout=10) as http:
        return http.request(method, path, **kw)  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _start(tmp_path: Path, url: str, ns: str) -> tuple[subprocess.Popen[str], str, list[int]]:
    """``capmon serve --workers 2`` on a free port, once it serves: the process, its
    origin and its workers' pids (worker 1's first)."""
    config = _config(tmp_path, url, ns)
    argv = [sys.executable, "-m", "capmon.cli", "serve", "--config", str(config), "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*argv, "--workers", "2"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    banner = proc.stdout.readline()
    found = BANNER.search(banner)
    if not found:  # say why: the supervisor's and the workers' log
        proc.terminate()
        _, err = proc.communicate(timeout=20)
        raise AssertionError(f"no banner: {banner!r}, exit {proc.returncode}, stderr: {err[-3000:]}")
    return proc, f"http://127.0.0.1:{found.group(1)}", [int(found.group(2)), int(found.group(3))]


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (Linux's /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it exited meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def _standing_by(supervisor: int, workers: list[int]) -> int:
    """The supervisor's spare worker (its child other than ``workers``) once it has imported
    what a worker needs and waits for its number: in a read of its stdin (Linux's
    /proc/PID/syscall: "0 0x0 ...", read on fd 0)."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        for pid in _children(supervisor) - set(workers):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/syscall").read_text().startswith("0 0x0 "):
                    return pid
        time.sleep(0.05)
    raise AssertionError("no spare worker stood by within 30 s")


class _Stderr:
    """The gateway's stderr read as it comes, each line with when it came (a thread), so
    that a test can wait for a line or time one."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line))

    def find(self, pattern: str) -> tuple[float, re.Match[str]] | None:
        for at, line in list(self.lines):
            found = re.search(pattern, line)
            if found:
                return at, found
        return None

    def wait_for(self, pattern: str, within: float) -> tuple[float, re.Match[str]] | None:
        deadline = time.monotonic() + within
        while (found := self.find(pattern)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return found

    def text(self) -> str:
        """All of it, once the process has exited."""
        self._thread.join(timeout=10)
        return "".join(line for _, line in self.lines)


def test_two_workers_serve_one_port_as_one_client_and_stop_together(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    namespace: str,  # noqa: F811
) -> None:
    proc, origin, pids = _start(tmp_path, redis_url, namespace)
    try:
        # Both serve: each connection is one worker's, and the reply says whose.
        served: dict[str, int] = {}
        chats = 0
        while len(served) < 2 and chats < 60:
            r = _fresh(origin, "POST", "/v1/chat/completions", json=CHAT)
            assert r.status_code == 200, r.text
            chats += 1
            served[r.headers["x-capmon-worker"]] = served.get(r.headers["x-capmon-worker"], 0) + 1
        assert set(served) == {"1", "2"}, served

        # A trip through one worker is seen through the other (the shared state, pushed by pub/sub).
        admin = {"authorization": f"Bearer {ADMIN}"}
        tripped = _fresh(origin, "POST", "/capmon/trip", json={"target": "medium"}, headers=admin)
        assert tripped.status_code == 200, tripped.text
        by = tripped.headers["x-capmon-worker"]
        seen = None
        deadline = time.monotonic() + 5.0
        while seen is None and time.monotonic() < deadline:
            r = _fresh(origin, "GET", "/capmon/snapshot")
            states = {t["state"] for t in r.json()["targets"] if t["model"] == "medium"}
            if r.headers["x-capmon-worker"] != by and states == {"forced-open"}:
                seen = r.headers["x-capmon-worker"]
        assert seen is not None and seen != by, f"worker {by} tripped medium; the other never showed it"

        # /metrics from either worker counts both workers' answers.
        text = _fresh(origin, "GET", "/metrics").text
        count = re.search(r'capmon_gateway_responses_total\{api="chat",status="200"\} (\S+)', text)
        assert count is not None and float(count.group(1)) == chats, text[:2000]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert err.count("stopped") == 2 and "Traceback" not in err, err
    assert not any(_alive(pid) for pid in pids)


CLIENTS = 12  # requests in flight at every moment, each on a connection of its own
# Seconds from a worker's SIGKILL to its replacement (a spare forked ahead) serving: well under
# one on a quiet machine; the bound is loose because the suite shares 2 cores with other work
# (3.7 s was seen at a load of 4), and what is tested is that the spare takes over, not how fast.
BACK_WITHIN = 5.0


@dataclass
class _Load:
    """What a steady load saw: each reply's (start, end, status, worker) and each
    request that got no reply's (start, error, client), on the monotonic clock."""

    replies: list[tuple[float, float, int, str]] = field(default_factory=list)
    failed: list[tuple[float, str, int]] = field(default_factory=list)

    def served_by(self, worker: str, since: float) -> list[tuple[float, float, int, str]]:
        return [r for r in self.replies if r[3] == worker and r[0] > since]


async def _kill_under_load(origin: str, pid: int, number: str) -> tuple[_Load, float]:
    """CLIENTS requests in flight all along, each on a fresh connection (the kernel picks a
    worker per connection); once both workers have answered, SIGKILL ``pid`` (worker
    ``number``); the load goes on until its replacement has answered and one more second
    (or 2 x BACK_WITHIN). Returns what the load saw and when the kill was sent."""
    load = _Load()
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=origin, trust_env=False, timeout=20, limits=limits) as http:

        async def client(n: int) -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    r = await http.post("/v1/chat/completions", json=CHAT)
                except httpx.TransportError as e:
                    load.failed.append((t0, repr(e), n))
                else:
                    load.replies.append((t0, time.monotonic(), r.status_code, r.headers.get("x-capmon-worker", "")))

        async def until(done: Callable[[], bool], limit: float) -> None:
            end = time.monotonic() + limit
            while not done() and time.monotonic() < end:
                await asyncio.sleep(0.02)

        clients = [asyncio.create_task(client(n)) for n in range(CLIENTS)]
        try:
            await until(lambda: {"1", "2"} <= {r[3] for r in load.replies}, 20.0)
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            await until(lambda: bool(load.served_by(number, killed_at)), 2 * BACK_WITHIN)
            await asyncio.sleep(1.0)  # the survivor and the replacement, serving side by side
        finally:
            stop.set()
            await asyncio.gather(*clients)
    return load, killed_at


def test_a_worker_killed_under_load_is_restarted_while_the_other_serves_on(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    namespace: str,  # noqa: F811
) -> None:
    proc, origin, pids = _start(tmp_path, redis_url, namespace)
    stderr = _Stderr(proc)
    try:
        spare = _standing_by(proc.pid, pids)  # as it is once the gateway has served a while
        # Worker 2: worker 1 serves the config's simulator (the first to start makes it),
        # which every worker's requests go to; a provider that vanishes is not the subject.
        load, killed_at = asyncio.run(_kill_under_load(origin, pids[1], "2"))
        try:
            metrics = _fresh(origin, "GET", "/metrics").text
        except httpx.TransportError as e:  # no gateway any more: said below, after what the load saw
            metrics = repr(e)
    finally:
        started = _children(proc.pid)  # the workers and the next spare
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    err = stderr.text()
    ok = [r for r in load.replies if r[2] == 200]
    assert len(ok) == len(load.replies), [r for r in load.replies if r[2] != 200][:5]

    # Only what was in flight on the killed worker failed, and what landed on its socket as it
    # died: a client whose request the kill cut sends the next at once, and the kernel can hand
    # that connection to the dying worker's listening socket before the exit closes it (the
    # exit closes the accepted connections and the listener one by one). So at most two per
    # client, none sent later than a moment after the kill.
    per_client = [sum(1 for f in load.failed if f[2] == n) for n in range(CLIENTS)]
    assert max(per_client) <= 2, (per_client, load.failed)
    late = [f for f in load.failed if f[0] > killed_at + 1.0]
    assert not late, (late, err[-3000:])
    # Worker 1 served on all along, and worker 2 is back: its replacement (the spare) says it
    # serves within BACK_WITHIN of the kill, and answers.
    assert len(load.served_by("1", killed_at + 0.5)) >= CLIENTS, len(load.served_by("1", killed_at))
    died = stderr.find(rf"worker 2 \(pid {pids[1]}\) died by signal SIGKILL; restarting it")
    again = stderr.find(r"worker 2 serves again \(pid (\d+)\)")
    assert died and again and died[0] <= again[0], err[-3000:]
    assert again[0] - killed_at <= BACK_WITHIN and again[1].group(1) == str(spare), (again[0] - killed_at, err)
    assert load.served_by("2", killed_at), f"worker 2 never answered again: {err[-3000:]}"
    # /metrics still counts what the killed worker answered (its files are kept).
    count = re.search(r'capmon_gateway_responses_total\{api="chat",status="200"\} (\S+)', metrics)
    assert count is not None and len(ok) <= float(count.group(1)) <= len(ok) + len(load.failed), metrics[:2000]

    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert spare in started and len(started) == 3, started
    assert not any(_alive(pid) for pid in started)


@pytest.mark.timeout(120)  # five starts of a Python process, each a second or more on a busy machine
def test_a_worker_that_keeps_dying_stops_the_gateway_with_a_line_saying_why(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    namespace: str,  # noqa: F811
) -> None:
    proc, _, pids = _start(tmp_path, redis_url, namespace)
    # Every replacement of worker 2 reads this config and exits 2 before it serves.
    (tmp_path / "config.toml").write_text("[gateway\n")
    os.kill(pids[1], signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, err[-3000:]  # the last death's code: the config error's
    assert err.count("not valid TOML") == 4, err[-3000:]  # each replacement said why it could not start
    assert re.search(r"worker 2 died 5 times within 60s .*; stopping the gateway", err), err[-3000:]
    assert "capmon gateway worker 1: stopped" in err and "Traceback" not in err, err[-3000:]
    assert not _alive(pids[0])


def test_sigterm_while_a_worker_restarts_stops_everything_it_started(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    namespace: str,  # noqa: F811
) -> None:
    proc, _, pids = _start(tmp_path, redis_url, namespace)
    stderr = _Stderr(proc)
    try:
        # At once: the spare has just been started, and its imports alone take longer
        # than the pause and the 0.15 s below, so the SIGTERM comes while worker 2 restarts.
        os.kill(pids[1], signal.SIGKILL)
        assert stderr.wait_for(r"worker 2 \(pid \d+\) died by signal SIGKILL; restarting it in 0\.1s", 10.0)
        time.sleep(0.15)
        started = _children(proc.pid)
        assert started - {pids[0]}, "no replacement was started"
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        proc.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = stderr.text()
    assert proc.returncode == 130 and took < 15.0, (proc.returncode, took, err[-3000:])
    assert "serves again" not in err and "Traceback" not in err, err[-3000:]
    assert not any(_alive(pid) for pid in (pids[0], *started))


def test_the_crash_loop_rule_pauses_longer_each_death_and_gives_up_at_the_fifth_within_a_minute() -> None:
    deaths = Deaths(CRASH_LOOP)
    assert [deaths.died(2, t) for t in (0.0, 1.0, 2.0, 3.0)] == [0.1, 0.2, 0.4, 0.8]
    assert deaths.died(1, 3.5) == 0.1  # each worker's deaths are its own
    assert deaths.died(2, 59.9) is None  # the fifth within 60 s
    slow = Deaths(CRASH_LOOP)
    assert [slow.died(2, t) for t in (0.0, 20.0, 40.0, 55.0)] == [0.1, 0.2, 0.4, 0.8]
    assert slow.died(2, 60.0) == 0.8  # the first has left the window: four in it
    assert slow.died(2, 75.0) is None


def test_more_than_one_worker_without_shared_redis_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _shipped_config(tmp_path)
    code = main(["serve", "--config", str(config), "--listen", "127.0.0.1:0", "--workers", "2"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(config) in lines[0] and "shared.backend" in lines[0], err
    assert 'backend = "redis"' in lines[0]
