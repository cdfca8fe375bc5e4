"""The access log: one JSON line per request (capmon/gateway/exchange.py says what is in
it: never a key, never prompt or answer text), to a file or to stderr (``-``).

Lines are written off the request path: a request only appends its line to a bounded
queue, and a thread writes out what has come every FLUSH_INTERVAL. The thread is not woken
per line: a wake-up per request (a condition's notify) made the request's thread wait for
the GIL, a sixth of the gateway's time at 500 QPS. A log that cannot keep up (the queue full), or cannot be
written at all (a full disk, a closed pipe, a file whose writes fail), never fails or
slows a request: its lines are dropped and counted, and the gateway's log says so once,
and again with the count when the gateway stops.

Nor does it hold up the gateway's start or stop. A path that cannot be opened without
waiting (a FIFO with no reader: opening it would wait for one) is refused at start.
Stopping waits for the writer at most CLOSE_TIMEOUT, and gives up sooner on one that has
written nothing for STALLED seconds: stuck in a write to a pipe nobody reads. That thread
is left behind (a daemon), its file open (closing it would flush, and wait as it does),
and the lines it did not write are counted as dropped. On stderr it writes through the
gateway log's own file object (capmon/gateway/gateway_log.py says why)."""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import threading
from typing import Any, TextIO

from capmon.core.base.exceptions import ConfigError
from capmon.gateway.errors import json_bytes
from capmon.gateway.gateway_log import stderr

log = logging.getLogger("capmon.gateway")

STDERR = "-"
QUEUE_LINES = 10_000  # lines waiting for the writer at most; past it they are dropped
BATCH_LINES = 256  # lines written (and flushed) together
FLUSH_INTERVAL = 0.05  # seconds between the writer's rounds: a line is in the file about this soon
CLOSE_TIMEOUT = 5.0  # seconds the writer gets to write what is queued when the gateway stops
STALLED = 1.0  # seconds without a line written (or dropped) after which a stopping writer is given up


class AccessLog:
    def __init__(self, where: str, *, capacity: int = QUEUE_LINES, stream: TextIO | None = None) -> None:
        """``where``: a file's path (appended to) or ``-`` for stderr; ``stream``: write
        there instead (tests). A file that cannot be opened is a ConfigError at start."""
        self.where = where
        self._own = stream is None and where != STDERR
        if stream is not None:
            self._out = stream
        elif where == STDERR:
            self._out = stderr()
        else:
            self._out = _open(where)
        self._lines: collections.deque[str] = collections.deque()  # appends and pops are thread-safe
        self._capacity = capacity
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self.dropped = 0
        self.written = 0
        self._writing = 0  # lines in the write under way
        self._told = False
        self._thread = threading.Thread(target=self._run, name="capmon-access-log", daemon=True)
        self._thread.start()

    def write(self, line: dict[str, Any]) -> None:
        """Queue one line; never blocks, never raises for the log's own trouble."""
        if len(self._lines) >= self._capacity:
            self._drop(1, "the access log cannot keep up")
            return
        self._lines.append(json_bytes(line).decode("ascii") + "\n")

    def _drop(self, lines: int, why: str) -> None:
        with self._lock:
            self.dropped += lines
            tell, self._told = not self._told, True
        if tell:
            log.warning("access log %s: %s; lines are dropped (and counted) until it can be written", self.where, why)

    def _run(self) -> None:
        while True:
            closing = self._closing.wait(FLUSH_INTERVAL)
            while self._lines:
                batch: list[str] = []
                with contextlib.suppress(IndexError):
                    while len(batch) < BATCH_LINES:
                        batch.append(self._lines.popleft())
                self._emit(batch)
            if closing:
                return

    def _emit(self, lines: list[str]) -> None:
        self._writing = len(lines)
        try:
            self._out.write("".join(lines))
            self._out.flush()
        except (OSError, ValueError) as e:  # ValueError: a stream closed under it
            self._drop(len(lines), f"cannot be written ({type(e).__name__}: {e})")
        else:
            self.written += len(lines)
        self._writing = 0

    def close(self) -> None:
        """Write what is queued, then stop: waiting at most CLOSE_TIMEOUT, and no longer
        than STALLED once nothing gets written. Never writes itself."""
        self._closing.set()
        for _ in range(round(CLOSE_TIMEOUT / STALLED)):
            done = self.written + self.dropped
            self._thread.join(STALLED)
            if not self._thread.is_alive() or self.written + self.dropped == done:
                break
        if self._thread.is_alive():  # stuck in a write: left behind, with its file open
            left = len(self._lines) + self._writing
            if left:
                self._drop(left, "its writer is stuck in a write (a pipe nobody reads?) as the gateway stops")
        elif self._own:
            with contextlib.suppress(OSError):
                self._out.close()
        if self.dropped:
            log.warning("access log %s: %d line(s) dropped in all", self.where, self.dropped)


def _open(where: str) -> TextIO:
    """The file at ``where``, to append to. Opened without waiting: a FIFO with no reader
    (ENXIO) would make the open wait for one, and the gateway never listen."""
    try:
        fd = os.open(where, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
    except OSError as e:
        why = (
            "it is a FIFO (named pipe) that nothing reads; start its reader first"
            if e.errno == errno.ENXIO
            else e.strerror or str(e)
        )
        raise ConfigError(where, "gateway.access_log", f"cannot open the access log: {why}") from None
    os.set_blocking(fd, True)  # the writer thread may wait on a slow reader; nothing else writes to it
    return open(fd, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
