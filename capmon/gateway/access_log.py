"""The access log: one JSON line per request (capmon/gateway/exchange.py says what is in
it: never a key, never prompt or answer text), to a file or to stderr (``-``).

Lines are written off the request path: a request only appends its line to a bounded
queue, and a thread writes out what has come every FLUSH_INTERVAL. The thread is not woken
per line: a wake-up per request (a condition's notify) made the request's thread wait for
the GIL, a sixth of the gateway's time at 500 QPS. A log that cannot keep up (the queue full), or cannot be
written at all (a full disk, a closed pipe, a file whose writes fail), never fails or
slows a request: its lines are dropped and counted, and the gateway's log says so once,
and again with the count when the gateway stops."""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
from typing import Any, TextIO

from capmon.core.exceptions import ConfigError
from capmon.gateway.errors import json_bytes

log = logging.getLogger("capmon.gateway")

STDERR = "-"
QUEUE_LINES = 10_000  # lines waiting for the writer at most; past it they are dropped
BATCH_LINES = 256  # lines written (and flushed) together
FLUSH_INTERVAL = 0.05  # seconds between the writer's rounds: a line is in the file about this soon
CLOSE_TIMEOUT = 5.0  # seconds the writer gets to write what is queued when the gateway stops


class AccessLog:
    def __init__(self, where: str, *, capacity: int = QUEUE_LINES, stream: TextIO | None = None) -> None:
        """``where``: a file's path (appended to) or ``-`` for stderr; ``stream``: write
        there instead (tests). A file that cannot be opened is a ConfigError at start."""
        self.where = where
        self._own = stream is None and where != STDERR
        if stream is not None:
            self._out = stream
        elif where == STDERR:
            self._out = sys.stderr
        else:
            try:
                self._out = open(where, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
            except OSError as e:
                raise ConfigError(
                    where, "gateway.access_log", f"cannot open the access log: {e.strerror or e}"
                ) from None
        self._lines: collections.deque[str] = collections.deque()  # appends and pops are thread-safe
        self._capacity = capacity
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self.dropped = 0
        self.written = 0
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
        try:
            self._out.write("".join(lines))
            self._out.flush()
        except (OSError, ValueError) as e:  # ValueError: a stream closed under it
            self._drop(len(lines), f"cannot be written ({type(e).__name__}: {e})")
        else:
            self.written += len(lines)

    def close(self) -> None:
        """Write what is queued (for at most CLOSE_TIMEOUT), then stop."""
        self._closing.set()
        self._thread.join(CLOSE_TIMEOUT)
        if self._own:
            with contextlib.suppress(OSError):
                self._out.close()
        if self.dropped:
            log.warning("access log %s: %d line(s) dropped in all", self.where, self.dropped)
