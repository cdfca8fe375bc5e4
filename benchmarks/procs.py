"""What the benchmark scripts share about the processes they start and the tables they
print: free ports, starting a helper so that it dies with us, waiting for it to listen
or to say a word, stopping it, sampling the simulator's stats while a run goes, reading
a process's CPU and memory from /proc, and a Markdown table laid out by the project's
one table formatter (``capmon.core.base.text.table``).

Every benchmark runs its servers and load in processes of their own (on 2 cores a
process is the unit that gets a core), so these are used by run.py, fleet.py,
overhead.py, gateway.py and the gateway peer alike.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from capmon.core.base.text import table

ROOT = Path(__file__).resolve().parent.parent  # the repository: every helper starts here


# ---------------------------------------------------------------- ports and HTTP


def free_port() -> int:
    """A port free on 127.0.0.1 now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get_json(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, if not with a 200: it is up
    except OSError:
        return False


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen[Any], what: str, timeout: float) -> None:
    """Until ``ready()``; RuntimeError when ``proc`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if ready():
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not start within {timeout:g} s")


def wait_http(url: str, proc: subprocess.Popen[Any], what: str, timeout: float = 20.0) -> None:
    """Until a GET of ``url`` gets any HTTP answer."""
    wait_until(lambda: _answers(url), proc, what, timeout)


def wait_port(port: int, proc: subprocess.Popen[Any], what: str, timeout: float = 15.0) -> None:
    """Until 127.0.0.1:``port`` takes a connection."""

    def accepts() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    wait_until(accepts, proc, what, timeout)


# ---------------------------------------------------------------- starting and stopping


def _die_with_parent() -> None:
    # Linux: the helper gets SIGTERM when the process that started it dies, however it
    # dies (a peer killed by the runner's time limit, kill -9), so no server outlives a run.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def spawn(cmd: Sequence[str], env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen[Any]:
    """``cmd`` in the repository, unbuffered, stopped by the kernel if we die first."""
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    environ = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(list(cmd), cwd=ROOT, env=environ, preexec_fn=preexec, **popen)


def stop(proc: subprocess.Popen[Any], kill: bool = False) -> None:
    """SIGTERM and 10 s to go (SIGKILL after that); ``kill``: SIGKILL at once."""
    if proc.poll() is None and kill:
        proc.kill()
        proc.wait()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_simulator(
    port: int, scenario: Path | str, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[Any]:
    """``python -m capmon.sim`` on 127.0.0.1:``port`` playing ``scenario``, its output in
    ``log``; returns once its admin API answers."""
    cmd = [sys.executable, "-m", "capmon.sim", "--listen", f"127.0.0.1:{port}", "--scenario", str(scenario)]
    with open(log, "w") as out:  # the child keeps its own descriptor
        proc = spawn(cmd, env, stdout=out, stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/admin/stats", proc, "the simulator")
    return proc


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``proc`` writes on stdout, stripped; "" at its exit or after ``timeout``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else ""


def wait_line(proc: subprocess.Popen[str], word: str, timeout: float) -> bool:
    """Read ``proc``'s stdout until the line ``word`` (True), its exit or ``timeout`` (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if not line:
                return False
            if line.strip() == word:
                return True
        elif proc.poll() is not None:
            return False
    return False


# ---------------------------------------------------------------- sampling the simulator


class Sampler:
    """Polls the simulator's /admin/stats a few times a second while a run goes, to tell
    how full each model was kept (mean in-flight / slots) and when (the simulator's own
    clock, the one its schedules count in). Cheap for the simulator: a small JSON.
    Used by run.py and fleet.py."""

    def __init__(self, origin: str, period: float = 0.2) -> None:
        import threading

        self.origin = origin
        self.period = period
        self.samples: list[dict[str, tuple[int, int]]] = []  # per model: (in flight, slots)
        self.times: list[float] = []  # the simulator's elapsed seconds at each sample
        self.rejected: list[int] = []  # cumulative rejections at each sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                stats = get_json(self.origin + "/admin/stats", timeout=1.0)
            except (OSError, ValueError):
                continue
            self.samples.append({n: (m["in_flight"], m["slots"]) for n, m in stats["models"].items()})
            self.times.append(stats["elapsed"])
            r = stats["totals"]["rejected"]
            self.rejected.append(r["capacity"] + r["rate_limited"])

    def peak_rejections(self) -> int:
        """The most rejections between two samples (0.2 s): a herd shows up as a spike."""
        return max((b - a for a, b in zip(self.rejected, self.rejected[1:], strict=False)), default=0)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(2.0)
        # Only while work was going on: from the first sample with anything in flight to the last.
        busy = [i for i, s in enumerate(self.samples) if any(f for f, _ in s.values())]
        window = self.samples[busy[0] : busy[-1] + 1] if busy else []
        out: dict[str, float] = {}
        for name in window[0] if window else {}:
            used = sum(s[name][0] for s in window)
            slots = sum(s[name][1] for s in window)
            out[name] = round(used / slots, 3) if slots else float("nan")
        return out


# ---------------------------------------------------------------- what a process costs


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (its threads included), from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def descendants(pid: int) -> list[int]:
    """``pid``'s children, theirs, and so on (a supervisor's workers), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and every live descendant of it (a gateway and its workers)."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
    return total


def wait_quiet(
    pids: Sequence[int], share: float = 0.05, window: float = 1.0, cap: float = 90.0, step: float = 0.25
) -> tuple[float, float]:
    """Until the process trees of ``pids`` together use under ``share`` of a core over the
    last ``window`` seconds (a proxy that has worked off what the last load left it), or
    ``cap`` seconds have passed: (the seconds waited, that share over the last window)."""
    start = time.monotonic()
    samples: collections.deque[tuple[float, float]] = collections.deque()  # (when, CPU seconds)
    while True:
        now = time.monotonic()
        cpu = sum(tree_cpu_seconds(p) for p in pids)
        samples.append((now, cpu))
        while len(samples) > 1 and now - samples[1][0] >= window:
            samples.popleft()  # the oldest sample kept is the last one a whole window old
        then, cpu_then = samples[0]
        used = (cpu - cpu_then) / (now - then) if now - then >= window else float("nan")
        if used < share or now - start >= cap:
            return now - start, used
        time.sleep(step)


def rss_mb(pid: int) -> float:
    """``pid``'s resident set size in MiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def open_fds(pid: int) -> int:
    """How many file descriptors ``pid`` holds (its sockets: one per connection), from /proc."""
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---------------------------------------------------------------- tables


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table whose columns line up in the source too: the cells and their bars
    laid out by ``capmon.core.base.text.table``."""

    def bars(cells: Sequence[str]) -> list[str]:
        out = ["|"]
        for c in cells:
            out += [c, "|"]
        return out

    lines = [bars(head), bars(["---"] * len(head)), *(bars(r) for r in rows)]
    return "\n".join(table(lines))
