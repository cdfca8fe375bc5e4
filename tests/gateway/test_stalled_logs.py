"""`capmon serve` whose stderr or access log is a pipe nobody drains, as a real process: it
keeps answering (its own log, the libraries' and the access log drop and count what they
cannot write; nothing on the request path waits on a pipe), a SIGTERM still stops it within
seconds (exit 130), and an access log that is a FIFO nobody reads is refused at start in
one line instead of hanging the open.

A pipe's buffer holds 64 KiB; an access log line is about 450 bytes, so a few hundred
requests fill it, and the requests here are several times that."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from capmon.gateway.gateway_log import GatewayLog
from capmon.gateway.traces import SHUTDOWN_S
from tests.support.configs import shipped_config
from tests.support.scripted import free_port

PIPE_BYTES = 64 * 1024
LINE_BYTES = 450  # about, an access log line of a chat request
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 8}
# Quick answers, so that thousands of requests take seconds.
SCENARIO = 'name = "quick"\n' + "".join(
    f'[[models]]\nname = "sim-{m}"\nslots = 64\nbase_latency = 0.0\nper_token = 0.0\nnoise = 0.0\n'
    f"answer_tokens = 4\ncontext_window = 200000\n{api}"
    for m, api in (("flagship", ""), ("claude", 'api = "anthropic"\n'), ("medium", ""), ("small", ""))
)
STOP_WITHIN = 10.0  # seconds a SIGTERM may take to stop the gateway, whatever its pipes do


def _env(**extra: str) -> dict[str, str]:
    """The environment with stderr buffered, as Python's default is (this one may set
    PYTHONUNBUFFERED): a writer stuck in a buffered write holds its stream's lock."""
    drop = ("CAPMON_", "OTEL_", "PYTHONUNBUFFERED")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


@contextlib.contextmanager
def _gateway(
    tmp_path: Path, access_log: str, *, extra: str = "", stderr: int | None = None, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A real `capmon serve` on the shipped config (its simulator answering at once);
    yields the process and its origin once it serves. Killed if still running at the end."""
    config, _ = shipped_config(tmp_path, SCENARIO, extra=extra)
    port = free_port()
    argv = ["serve", "--config", str(config), "--listen", f"127.0.0.1:{port}", "--access-log", access_log]
    proc = subprocess.Popen(
        [sys.executable, "-m", "capmon.cli", *argv],
        cwd=tmp_path,
        env=env or _env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert f"listening on http://127.0.0.1:{port}/v1" in banner, (banner, proc.poll())
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


class _Stalled:
    """A pipe whose reader never reads (until :meth:`held`, once its writer is gone): an
    anonymous one, its write end ``w`` for a process's stderr, or a FIFO made at ``fifo``."""

    def __init__(self, fifo: Path | None = None) -> None:
        if fifo is None:
            self.r, self.w = os.pipe()
        else:
            os.mkfifo(fifo)
            self.r, self.w = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), -1
        fcntl.fcntl(self.r, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # the usual size, whatever the machine's pages

    def given(self) -> None:
        """The write end is the process's now: ours is closed."""
        if self.w >= 0:
            os.close(self.w)
            self.w = -1

    def held(self) -> int:
        """How many bytes the pipe held: a full pipe holds about PIPE_BYTES."""
        held = 0
        with contextlib.suppress(BlockingIOError):
            os.set_blocking(self.r, False)
            while chunk := os.read(self.r, PIPE_BYTES):
                held += len(chunk)
        return held


@contextlib.contextmanager
def _stalled(fifo: Path | None = None) -> Iterator[_Stalled]:
    pipe = _Stalled(fifo)
    try:
        yield pipe
    finally:
        pipe.given()
        os.close(pipe.r)


async def _ask(origin: str, requests: int, concurrency: int = 8, timeout: float = 10.0) -> int:
    """Send ``requests`` chat requests, ``concurrency`` at a time; each must be answered
    within ``timeout`` seconds (a gateway whose loop is blocked answers none). Returns how
    many got a 200."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=origin, timeout=timeout, limits=limits, trust_env=False) as http:
        left = iter(range(requests))
        ok = 0

        async def one() -> None:
            nonlocal ok
            for _ in left:
                reply = await http.post("/v1/chat/completions", json=CHAT)
                ok += reply.status_code == 200

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return ok


def _stop(proc: subprocess.Popen[str], within: float = STOP_WITHIN) -> tuple[int | None, float]:
    """SIGTERM; the exit code and how long it took (None: still running after ``within`` seconds)."""
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code: int | None = proc.wait(within)
    except subprocess.TimeoutExpired:
        code = None
    return code, time.monotonic() - began


async def test_a_stalled_stderr_and_a_dead_collector_cost_log_lines_not_answers(tmp_path: Path) -> None:
    """The access log on stderr (`-`), stderr a pipe nobody reads, and traces for a collector
    that is not there: the span queue fills (the relay cannot send; OpenTelemetry then logs a
    warning from the request's own thread), the pipe fills, and the gateway answers on."""
    requests = 6 * PIPE_BYTES // LINE_BYTES  # the access log's lines alone fill the pipe six times over
    telemetry = f'\n[telemetry]\notlp_endpoint = "http://127.0.0.1:{free_port()}"\n'
    # A small span queue (OpenTelemetry's own variables) fills within the first hundred requests.
    env = _env(OTEL_BSP_MAX_QUEUE_SIZE="64", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="16", OTEL_BSP_SCHEDULE_DELAY="20")
    with _stalled() as err:
        with _gateway(tmp_path, "-", extra=telemetry, stderr=err.w, env=env) as (proc, origin):
            err.given()
            ok = await asyncio.wait_for(_ask(origin, requests), 180)
            # The last spans get their own bound on top (capmon/gateway/traces.py).
            code, took = _stop(proc, STOP_WITHIN + SHUTDOWN_S)
        held = err.held()
    assert ok == requests
    assert held > PIPE_BYTES // 2  # the pipe was full: the gateway answered on past it
    assert code == 130, f"still running {took:.1f}s after SIGTERM"


@pytest.mark.parametrize("where", ["stderr", "fifo"])
async def test_a_sigterm_stops_a_gateway_whose_access_log_pipe_is_stalled(tmp_path: Path, where: str) -> None:
    """The access log is a pipe whose reader stopped reading (stderr with `-`, or a FIFO
    whose reader holds it open and never reads): its writer is stuck in a write, and the
    gateway still stops within STOP_WITHIN seconds of a SIGTERM, exit 130."""
    requests = 3 * PIPE_BYTES // LINE_BYTES
    with _stalled(tmp_path / "access.fifo" if where == "fifo" else None) as pipe:
        target, stderr = ("-", pipe.w) if where == "stderr" else (str(tmp_path / "access.fifo"), None)
        with _gateway(tmp_path, target, stderr=stderr) as (proc, origin):
            pipe.given()
            assert await asyncio.wait_for(_ask(origin, requests), 120) == requests
            await asyncio.sleep(0.5)  # the access log's writer is now stuck in its write
            code, took = _stop(proc)
        held = pipe.held()
    assert held > PIPE_BYTES // 2  # the pipe was full
    assert code == 130, f"still running {took:.1f}s after SIGTERM"


def test_an_access_log_fifo_nobody_reads_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    """Opening a FIFO for writing waits for a reader: the gateway would never listen."""
    fifo = tmp_path / "access.fifo"
    os.mkfifo(fifo)
    config, _ = shipped_config(tmp_path, SCENARIO)
    argv = ["serve", "--config", str(config), "--listen", f"127.0.0.1:{free_port()}", "--access-log", str(fifo)]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "capmon.cli", *argv],
            cwd=tmp_path,
            env=_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError("capmon serve hung opening the FIFO") from e
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"capmon: {fifo}: gateway.access_log: cannot open the access log: "
        "it is a FIFO (named pipe) that nothing reads; start its reader first"
    ]


class _Unraisable:
    def __del__(self) -> None:
        raise ValueError("raised in __del__")


def test_the_gateways_log_never_waits_on_a_stalled_stderr_and_says_what_it_dropped() -> None:
    """In process, on a real pipe: while nobody reads it, logging returns at once (what the
    queue cannot hold is dropped and counted); once it is read, the writer says once that
    lines were dropped, and the count when it stops; every line is written or counted. What
    would reach stderr around the root logger (a logger that does not propagate, Python's
    warnings, an exception in a __del__) goes the same way."""
    r, w = os.pipe()
    err = os.fdopen(w, "w")
    logger = logging.getLogger("some.library")
    unpropagated = logging.getLogger("some.library.quiet")
    unpropagated.propagate = False
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(r, PIPE_BYTES):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    try:
        with GatewayLog(err=err, capacity=10) as gateway_log:
            # A logger that does not propagate, with no handler of its own (as uvicorn's access
            # logger): logging's handler of last resort, through the queue too.
            unpropagated.warning("not propagated")
            _Unraisable()  # an exception in __del__: Python's hook would write it to sys.stderr
            warnings.warn("a library's warning", UserWarning, stacklevel=1)  # and so would warnings'
            for i in range(2000):  # about 450 KB: seven pipes' worth, while nobody reads
                logger.warning("line %d %s", i, "and more " * 24)
            dropped = gateway_log.dropped
            assert dropped > 0
            reader.start()
            gateway_log.last = "capmon gateway: stopped"
        err.close()
        reader.join(10)
    finally:
        os.close(r)
        unpropagated.propagate = True
    lines = got.decode().splitlines()
    written = [line for line in lines if "WARNING some.library: line " in line]
    assert lines[-2:] == [
        f"capmon gateway: WARNING capmon.gateway: {dropped} line(s) of the gateway's log dropped in all",
        "capmon gateway: stopped",
    ]
    assert sum("cannot keep up" in line for line in lines) == 1
    assert len(written) + dropped == 2000
    assert "capmon gateway: WARNING some.library.quiet: not propagated" in lines
    assert "ValueError: raised in __del__" in lines
    assert any("WARNING py.warnings: " in line and "UserWarning: a library's warning" in line for line in lines)
