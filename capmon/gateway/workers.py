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
exited: 130 when a signal stopped them.

A worker that dies while the gateway is not stopping (it exits by itself, or a signal
from elsewhere kills it: a crash, the OOM killer) is restarted, on the same port with the
same number, and the others serve on untouched; only what was in flight on it is lost.
The log says so, one line for the death (the worker, its pid, its exit code or signal)
and one when the replacement serves. The replacement is the spare: a ``capmon serve
--standby`` started once the workers serve, that has done a worker's imports (most of
its start: seconds on a busy machine) and waits on its stdin for the number it is to
take, so that a worker is back in a fraction of a second; it reads the config then, as
any worker does at its start. The next spare starts once the replacement is past its
start (not to slow it down); with none alive, the replacement is started from nothing.
The dead worker's prometheus files: ``mark_process_dead`` removes its live gauges' (it
has none today); those of its counters and histograms stay, so that ``/metrics`` keeps
what it counted and its sums never go back.

Only a crash loop stops the gateway (:class:`CrashLoop`): a worker's fifth death within
60 s, a replacement that exits before it serves counting as one, stops the others and
the gateway exits with that death's code (1 for a signal) and a line saying why, for
whatever runs ``capmon serve`` (systemd, a container's restart policy) to restart the
whole or a person to look. Before that, each death waits longer before its restart
(0.1, 0.2, 0.4, 0.8 s), so a worker that cannot start does not spin. A worker that cannot
start at all when the gateway starts (a bad config, a port) fails the gateway at once.
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
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from prometheus_client.multiprocess import mark_process_dead

from capmon.core.base.clock import default_clock
from capmon.exitcodes import EXIT_INTERRUPTED
from capmon.gateway.server import GatewayError, bind
from capmon.gateway.settings import METRICS_DIR_ENV, GatewaySettings

if TYPE_CHECKING:
    from capmon.gateway.serve import ServeOptions

log = logging.getLogger("capmon.gateway")

START_TIMEOUT = 120.0  # seconds a worker may take to say it listens (imports, the engine, Redis)
EXIT_WORKER_FAILED = 1  # a worker that died by a signal has no exit code of its own to pass on


@dataclass(frozen=True)
class CrashLoop:
    """When a dead worker is restarted, and when the gateway gives up: the worker's
    ``deaths``-th death within ``window`` seconds (a replacement that exits before it
    serves counts as one) is a crash loop; before that, the n-th death in the window waits
    ``first_pause * 2**(n-1)`` seconds before the restart (0.1, 0.2, 0.4, 0.8 s)."""

    deaths: int = 5
    window: float = 60.0
    first_pause: float = 0.1


class Deaths:
    """Each worker number's recent deaths, read against a :class:`CrashLoop`."""

    def __init__(self, rule: CrashLoop) -> None:
        self.rule = rule
        self._at: dict[int, deque[float]] = {}

    def died(self, number: int, now: float) -> float | None:
        """Worker ``number`` died at ``now``: the pause before its restart, or None when
        that was one death too many (a crash loop)."""
        at = self._at.setdefault(number, deque())
        at.append(now)
        while now - at[0] >= self.rule.window:
            at.popleft()
        if len(at) >= self.rule.deaths:
            return None
        return self.rule.first_pause * 2.0 ** (len(at) - 1)


CRASH_LOOP = CrashLoop()


@dataclass
class Worker:
    number: int
    proc: asyncio.subprocess.Process
    banner: str = ""


def worker_argv(options: ServeOptions, settings: GatewaySettings, number: int | None) -> list[str]:
    """``capmon serve`` for worker ``number`` (None: the spare, told its number later): the
    options the user gave, on the port the supervisor holds."""
    argv = [sys.executable, "-m", "capmon.cli", "serve", "--listen", f"{_host(settings.host)}:{settings.port}"]
    if options.config is not None:
        argv += ["--config", options.config]
    if options.access_log is not None:
        argv += ["--access-log", options.access_log]
    if options.loop is not None:
        argv += ["--loop", options.loop]
    return [
        *argv,
        "--workers",
        str(settings.workers),
        *(["--standby"] if number is None else ["--worker", str(number)]),
    ]


def stand_by(stdin: TextIO) -> int | None:
    """The spare's wait (in its process): with what every worker imports imported (most of
    a worker's start), the number of the worker it is to be, from the supervisor; None
    when the supervisor closed its stdin instead. Its config is read after, as any
    worker's at its start."""
    import capmon.fleet  # noqa: F401  (N > 1: the shared state is Redis's)

    line = stdin.readline()
    return int(line) if line.strip() else None


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


def _how(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        with contextlib.suppress(ValueError):
            return f"by signal {signal.Signals(-returncode).name}"
        return f"by signal {-returncode}"
    return f"with code {returncode}"


class Supervisor:
    def __init__(
        self,
        options: ServeOptions,
        settings: GatewaySettings,
        env: Mapping[str, str],
        out: TextIO,
    ) -> None:
        self.options = options
        self.settings = settings
        self.env = env
        self.out = out
        self.metrics_dir = ""
        self.workers: list[Worker] = []  # worker n's current process at [n - 1]
        self.spare: Worker | None = None  # number 0 until it replaces one
        self.stopped_by: list[int] = []
        self.stopping = asyncio.Event()  # a signal, or a crash loop: no worker is restarted any more
        self.gave_up: int | None = None  # a crash loop's exit code
        self.deaths = Deaths(CRASH_LOOP)
        self.clock = default_clock()

    def signal(self, signum: int) -> None:
        self.stopped_by.append(signum)
        self.stopping.set()
        for w in self._everyone():
            self._send(w, signum)

    def _everyone(self) -> list[Worker]:
        return [*self.workers, *([self.spare] if self.spare is not None else [])]

    @staticmethod
    def _send(w: Worker, signum: int) -> None:
        if w.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                # One that does not serve yet may have no handlers yet: SIGTERM's default
                # ends it at once, where a SIGINT would interrupt its imports with a traceback.
                w.proc.send_signal(signum if w.banner else signal.SIGTERM)

    async def start(self) -> None:
        """The first worker, then, once it serves, the others together: what a process
        makes when it finds none (the embedded simulator on its port, the namespace's
        first state in Redis) is made once, and the others borrow and join it."""
        numbers = list(range(1, self.settings.workers + 1))
        for batch in (numbers[:1], numbers[1:]):
            started = [await self._spawn(number) for number in batch]
            for w in started:
                assert w.proc.stdout is not None
                line = await asyncio.wait_for(w.proc.stdout.readline(), START_TIMEOUT)
                if not line:  # it exited first; what went wrong is on stderr already
                    raise _WorkerExited(w)
                w.banner = line.decode(errors="replace").strip()

    async def _spawn(self, number: int | None) -> Worker:
        """Worker ``number``'s process, in its place in ``workers`` (a replacement's too), or
        (None) the spare."""
        proc = await asyncio.create_subprocess_exec(
            *worker_argv(self.options, self.settings, number),
            env={**self.env, METRICS_DIR_ENV: self.metrics_dir},
            stdin=asyncio.subprocess.DEVNULL if number is not None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,  # its banner; its log goes to our stderr
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            process_group=0,
        )
        worker = Worker(number or 0, proc)
        if number is None:
            self.spare = worker
        else:
            self._place(worker)
        if self.stopping.is_set():  # a signal came while it was being started: it was not there to get it
            self._send(worker, signal.SIGTERM)
        return worker

    def _place(self, worker: Worker) -> None:
        if worker.number > len(self.workers):
            self.workers.append(worker)
        else:
            self.workers[worker.number - 1] = worker

    async def _replace(self, number: int) -> Worker:
        """Worker ``number``'s new process: the spare, told its number, when there is one
        still alive; else one started now (the imports too: some seconds on a busy machine)."""
        spare, self.spare = self.spare, None
        if spare is not None and spare.proc.returncode is None:
            assert spare.proc.stdin is not None
            spare.number = number
            self._place(spare)  # before the wait below: a signal meanwhile reaches it as a worker
            with contextlib.suppress(ConnectionError):  # else it died meanwhile
                spare.proc.stdin.write(b"%d\n" % number)
                await spare.proc.stdin.drain()
                spare.proc.stdin.close()
                return spare
        return await self._spawn(number)

    async def _ready_spare(self) -> None:
        if self.spare is None and not self.stopping.is_set():
            await self._spawn(None)

    async def _relay(self, w: Worker) -> None:
        """What a worker prints after its banner (its "stopped" goes to stderr)."""
        assert w.proc.stdout is not None
        async for line in w.proc.stdout:
            print(line.decode(errors="replace").rstrip("\n"), file=self.out, flush=True)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.signal, signum)
        self.metrics_dir = tempfile.mkdtemp(prefix="capmon-gateway-metrics-")
        try:
            try:
                await self.start()
            except (_WorkerExited, TimeoutError) as e:
                failed = e.worker if isinstance(e, _WorkerExited) else None
                await self._stop_all()
                if self.stopped_by:
                    return EXIT_INTERRUPTED
                if failed is not None:
                    log.error("worker %d exited with %s before it served", failed.number, failed.proc.returncode)
                    return _code(failed.proc)
                raise GatewayError(f"a gateway worker did not start within {START_TIMEOUT:g}s") from None
            print(self.banner(), file=self.out, flush=True)
            with contextlib.suppress(OSError):  # none: the first death starts its replacement itself
                await self._ready_spare()
            await asyncio.gather(*(self._keep(w.number) for w in self.workers))
            if self.spare is not None:  # stopped with the others (a signal) or now
                self._send(self.spare, signal.SIGTERM)
                await self.spare.proc.wait()
            return self.gave_up if self.gave_up is not None else EXIT_INTERRUPTED
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def banner(self) -> str:
        """The first worker's banner, saying how many there are and which processes."""
        first = self.workers[0].banner.replace(f"; worker 1 of {self.settings.workers}", "")
        pids = ", ".join(str(w.proc.pid) for w in self.workers)
        return first.replace("; Ctrl+C to stop)", f"; {len(self.workers)} workers, pids {pids}; Ctrl+C to stop)")

    async def _keep(self, number: int) -> None:
        """Worker ``number`` until the gateway stops: when its process dies (not stopped by
        a signal here), a new one on the same port with the same number, after a pause
        that grows with its recent deaths, until they make a crash loop (CrashLoop)."""
        w: Worker | None = self.workers[number - 1]
        why, code = "", EXIT_WORKER_FAILED
        while True:
            if w is not None:
                await self._relay(w)
                await w.proc.wait()
                if self.stopping.is_set():
                    return
                self._forget(w)
                served = "" if w.banner else " before it served"
                why, code = f"(pid {w.proc.pid}) died {_how(w.proc.returncode)}{served}", _code(w.proc)
            pause = self.deaths.died(number, self.clock.now())
            if pause is None:
                self._give_up(number, why, code)
                return
            log.warning("gateway worker %d %s; restarting it in %.1fs", number, why, pause)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):  # not wait_for: it can swallow a cancel (3.11)
                    await self.stopping.wait()
            if self.stopping.is_set():
                return
            try:
                w = await self._replace(number)
            except OSError as e:  # no process at all (no memory, no descriptors): a death like any other
                w, why, code = None, f"could not be started ({e})", EXIT_WORKER_FAILED
                continue
            if await self._started(w):
                log.warning("gateway worker %d serves again (pid %d)", number, w.proc.pid)
            # The next spare starts once this one is past its start, not to slow it down.
            with contextlib.suppress(OSError):  # none: the next death starts its replacement itself
                await self._ready_spare()

    async def _started(self, w: Worker) -> bool:
        """Whether a replacement says it serves (its banner); False: it exited first, or
        said nothing for START_TIMEOUT (then it is killed)."""
        assert w.proc.stdout is not None
        try:
            line = await asyncio.wait_for(w.proc.stdout.readline(), START_TIMEOUT)
        except TimeoutError:
            log.warning(
                "gateway worker %d (pid %d) did not serve within %gs; killing it", w.number, w.proc.pid, START_TIMEOUT
            )
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
            return False
        w.banner = line.decode(errors="replace").strip()
        return bool(line)

    def _forget(self, w: Worker) -> None:
        """prometheus_client's bookkeeping for a dead process: the files of its live gauges
        go (there are none today); those of its counters and histograms stay, so that
        /metrics' sums keep what it counted and never go back."""
        mark_process_dead(w.proc.pid, self.metrics_dir)  # type: ignore[no-untyped-call]

    def _give_up(self, number: int, why: str, code: int) -> None:
        self.gave_up = code or EXIT_WORKER_FAILED
        self.stopping.set()
        rule = self.deaths.rule
        log.error(
            "gateway worker %d died %d times within %gs (the last one %s), a crash loop; stopping the gateway",
            number,
            rule.deaths,
            rule.window,
            why,
        )
        for w in self._everyone():
            self._send(w, signal.SIGTERM)

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
