"""``capmon serve --workers N``: N processes serving one port, so that every core of a
machine serves (one Python process fills one core).

The supervisor (this module, in the process the user started) holds the port, bound with
SO_REUSEPORT but not listening, so a taken port says so at once and port 0 picks one
port for all; then it starts N workers (the first alone, the others once it serves), each
``capmon serve`` of its own (its own event loop, uvicorn server and engine) on that port
with SO_REUSEPORT, and the kernel spreads new connections over them. The workers act as
one client through the fleet: N > 1 needs ``[shared] backend = "redis"``
(capmon/gateway/settings.py says so, exit 2), so a breaker, a trip, a pin, the learned
limits and the leases are the whole gateway's.

What each worker answers for: the proxied APIs and the control API's actions and reads of
the shared state, like any process of a fleet. ``/metrics`` adds up every worker's
counters and histograms (prometheus_client's multiprocess mode, in a directory this
process makes and removes); its gauges, the snapshot and the event stream are those of
the worker that took the connection (its view of the shared state, its own requests'
events). Every reply says which worker served it (``x-capmon-worker``).

The supervisor forwards SIGINT and SIGTERM to every worker (they are in a process group
of their own, so a Ctrl+C reaches them once, through it) and exits when they have all
exited: 130 when a signal stopped them. A worker that exits by itself is not restarted:
the others are stopped and the gateway exits with its code, so that whatever runs
``capmon serve`` (systemd, a container's restart policy) sees the failure and restarts
the whole gateway, rather than it serving on with fewer cores than it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from capmon.exitcodes import EXIT_INTERRUPTED, EXIT_OK
from capmon.gateway.server import GatewayError, bind
from capmon.gateway.settings import METRICS_DIR_ENV, GatewaySettings

if TYPE_CHECKING:
    from capmon.gateway.serve import ServeOptions

log = logging.getLogger("capmon.gateway")

START_TIMEOUT = 120.0  # seconds a worker may take to say it listens (imports, the engine, Redis)
EXIT_WORKER_FAILED = 1  # a worker that died by a signal has no exit code of its own to pass on


@dataclass
class Worker:
    number: int
    proc: asyncio.subprocess.Process
    banner: str = ""


def worker_argv(options: ServeOptions, settings: GatewaySettings, number: int) -> list[str]:
    """``capmon serve`` for worker ``number``: the options the user gave, on the port the
    supervisor holds."""
    argv = [sys.executable, "-m", "capmon.cli", "serve", "--listen", f"{_host(settings.host)}:{settings.port}"]
    if options.config is not None:
        argv += ["--config", options.config]
    if options.access_log is not None:
        argv += ["--access-log", options.access_log]
    if options.loop is not None:
        argv += ["--loop", options.loop]
    return [*argv, "--workers", str(settings.workers), "--worker", str(number)]


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _die_with_parent() -> None:
    # Linux: a worker gets SIGTERM when the supervisor dies, however it dies (kill -9), so
    # no worker serves on alone. Its own process group keeps a Ctrl+C from reaching it twice.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _code(proc: asyncio.subprocess.Process) -> int:
    rc = proc.returncode
    return rc if rc is not None and rc >= 0 else EXIT_WORKER_FAILED


class Supervisor:
    def __init__(self, options: ServeOptions, settings: GatewaySettings, env: Mapping[str, str], out: TextIO) -> None:
        self.options = options
        self.settings = settings
        self.env = env
        self.out = out
        self.workers: list[Worker] = []
        self.stopped_by: list[int] = []

    def signal(self, signum: int) -> None:
        self.stopped_by.append(signum)
        for w in self.workers:
            if w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signum)

    async def start(self, metrics_dir: str) -> None:
        """The first worker, then, once it serves, the others together: what a process
        makes when it finds none (the embedded simulator on its port, the namespace's
        first state in Redis) is made once, and the others borrow and join it."""
        env = {**self.env, METRICS_DIR_ENV: metrics_dir}
        numbers = list(range(1, self.settings.workers + 1))
        for batch in (numbers[:1], numbers[1:]):
            started = [await self._spawn(number, env) for number in batch]
            for w in started:
                assert w.proc.stdout is not None
                line = await asyncio.wait_for(w.proc.stdout.readline(), START_TIMEOUT)
                if not line:  # it exited first; what went wrong is on stderr already
                    raise _WorkerExited(w)
                w.banner = line.decode(errors="replace").strip()

    async def _spawn(self, number: int, env: Mapping[str, str]) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            *worker_argv(self.options, self.settings, number),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,  # its banner; its log goes to our stderr
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            process_group=0,
        )
        worker = Worker(number, proc)
        self.workers.append(worker)
        return worker

    async def _relay(self, w: Worker) -> None:
        """What a worker prints after its banner (its "stopped" goes to stderr)."""
        assert w.proc.stdout is not None
        async for line in w.proc.stdout:
            print(line.decode(errors="replace").rstrip("\n"), file=self.out, flush=True)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.signal, signum)
        metrics_dir = tempfile.mkdtemp(prefix="capmon-gateway-metrics-")
        try:
            try:
                await self.start(metrics_dir)
            except (_WorkerExited, TimeoutError) as e:
                failed = e.worker if isinstance(e, _WorkerExited) else None
                await self._stop_all()
                if failed is not None:
                    log.error("worker %d exited with %s before it served", failed.number, failed.proc.returncode)
                    return _code(failed.proc)
                raise GatewayError(f"a gateway worker did not start within {START_TIMEOUT:g}s") from None
            print(self.banner(), file=self.out, flush=True)
            return await self._watch()
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            shutil.rmtree(metrics_dir, ignore_errors=True)

    def banner(self) -> str:
        """The first worker's banner, saying how many there are and which processes."""
        first = self.workers[0].banner.replace(f"; worker 1 of {self.settings.workers}", "")
        pids = ", ".join(str(w.proc.pid) for w in self.workers)
        return first.replace("; Ctrl+C to stop)", f"; {len(self.workers)} workers, pids {pids}; Ctrl+C to stop)")

    async def _watch(self) -> int:
        relays = [asyncio.create_task(self._relay(w)) for w in self.workers]
        waits = {asyncio.create_task(w.proc.wait()): w for w in self.workers}
        code = EXIT_OK
        pending = set(waits)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                w = waits[task]
                if not self.stopped_by and code == EXIT_OK:
                    # Not asked to stop: a worker died or failed. Stop the rest, pass its code on.
                    code = _code(w.proc) or EXIT_WORKER_FAILED
                    log.error(
                        "gateway worker %d (pid %d) exited with %s; stopping the other workers "
                        "(none is restarted: restart capmon serve)",
                        w.number,
                        w.proc.pid,
                        w.proc.returncode,
                    )
                    for other in self.workers:
                        if other.proc.returncode is None:
                            with contextlib.suppress(ProcessLookupError):
                                other.proc.terminate()
        for relay in relays:
            with contextlib.suppress(Exception):
                await relay
        if self.stopped_by and code == EXIT_OK:
            return EXIT_INTERRUPTED
        return code

    async def _stop_all(self) -> None:
        for w in self.workers:
            if w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.terminate()
        for w in self.workers:
            await w.proc.wait()


class _WorkerExited(Exception):
    def __init__(self, worker: Worker) -> None:
        super().__init__(f"worker {worker.number} exited")
        self.worker = worker


def supervise(options: ServeOptions, settings: GatewaySettings, env: Mapping[str, str], out: TextIO) -> int:
    """Serve with ``settings.workers`` processes until a signal stops them (or one fails).
    Raises GatewayError when the port cannot be held."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise GatewayError("--workers needs SO_REUSEPORT, which this platform does not have; serve with one worker")
    held = bind(settings.host, settings.port, reuse_port=True, listening=False)  # a taken port: one line, exit 2
    try:
        settings = dataclasses.replace(settings, port=held.getsockname()[1])
        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(Supervisor(options, settings, env, out).run())
        return EXIT_INTERRUPTED
    finally:
        held.close()
