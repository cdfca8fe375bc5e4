"""The gateway's own log: what capmon and every library under it (OpenTelemetry, uvicorn,
asyncio, httpx) log in ``capmon serve``, through the root logger, on stderr; every record
redacted, whichever logger it comes from. What would otherwise reach stderr around the root
logger goes the same way: logging's handler of last resort (a logger that does not
propagate), Python's warnings and its unraisable exceptions (in a ``__del__``).

Only one thread of its own ever waits on stderr. A record is put on a bounded queue
without waiting (the stdlib's QueueHandler, which on a full queue would print the error
to stderr: here it drops the record and counts it) and a QueueListener's thread writes
it. So a stderr nobody drains (a pipe whose reader stopped) blocks that thread only, never
a request's: OpenTelemetry, say, logs from the request's own thread when its span queue
is full. What the queue cannot hold is dropped and counted; that is said once, with the
next line that gets out, and the count when the gateway stops.

The writers (this one and the access log's, capmon/gateway/access_log.py) write to
:func:`stderr`, a file object of their own on the process's stderr, never to
``sys.stderr``: a writer stuck in a write holds its file object's lock, and the
interpreter flushes ``sys.stderr`` at exit, which would then wait for ever. Stopping hands
the writer the last lines and waits at most STOP_TIMEOUT; a writer still stuck in its
write is left behind (a daemon thread), and so is logging's own flush at exit, which would
wait for ever for the handler that writer holds.
"""

from __future__ import annotations

import atexit
import functools
import logging
import logging.handlers
import queue
import sys
import threading
from types import TracebackType
from typing import TextIO

from capmon.core.base.secrets import RedactSecrets

QUEUE_RECORDS = 1_000  # records waiting for the writer at most; past it they are dropped
STOP_TIMEOUT = 1.0  # seconds stopping waits for the writer to write the last lines
_PLAIN = "capmon_plain"  # a record attribute: the line is written as it is (GatewayLog.last)


class _Format(logging.Formatter):
    """The last line (GatewayLog.last) as it is; every other prefixed with who, level and logger."""

    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage() if getattr(record, _PLAIN, False) else super().format(record)


def log_handler(err: TextIO, worker: int | None = None) -> logging.Handler:
    """What writes the gateway's log on ``err``: every record redacted, whichever logger
    it comes from; a worker's lines say which worker."""
    handler = logging.StreamHandler(err)
    handler.addFilter(RedactSecrets())
    who = f"capmon gateway worker {worker}" if worker is not None else "capmon gateway"
    handler.setFormatter(_Format(who + ": %(levelname)s %(name)s: %(message)s"))
    return handler


def stderr() -> TextIO:
    """The process's stderr for the gateway's writer threads: one file object of their own
    on its descriptor (shared, so that their lines never interleave), or ``sys.stderr``
    itself when it has none (a test's capture)."""
    return _own(sys.stderr)


@functools.lru_cache(maxsize=1)
def _own(err: TextIO) -> TextIO:
    try:
        fd = err.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: no descriptor
        return err
    return open(fd, "w", encoding=err.encoding or "utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115


def _record(message: str, level: int = logging.WARNING, *, plain: bool = False) -> logging.LogRecord:
    return logging.makeLogRecord(
        {"name": "capmon.gateway", "levelno": level, "levelname": logging.getLevelName(level), "msg": message}
        | ({_PLAIN: True} if plain else {})
    )


def _unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    """An exception Python cannot raise (in a ``__del__``, say): logged, where the default
    hook would write it to sys.stderr from whichever thread it happened in."""
    what = unraisable.err_msg or "Exception ignored in"
    logging.getLogger("capmon.gateway").error("%s: %r", what, unraisable.object, exc_info=unraisable.exc_value)


class _Inlet(logging.handlers.QueueHandler):
    """A QueueHandler that never waits: a record that finds the queue full is dropped and counted."""

    def __init__(self, records: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__(records)
        self.dropped = 0
        self._count = threading.Lock()

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self._drop()

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        del record  # a record that cannot be formatted: the stdlib would print why on stderr, from the caller's thread
        self._drop()

    def _drop(self) -> None:
        with self._count:
            self.dropped += 1


class _Writer(logging.handlers.QueueListener):
    """Writes each record; before the first that gets out after a drop, says that lines are dropped."""

    def __init__(self, records: queue.Queue[logging.LogRecord | None], handler: logging.Handler, inlet: _Inlet) -> None:
        super().__init__(records, handler)
        self.records = records
        self.inlet = inlet
        self.told = False

    def handle(self, record: logging.LogRecord) -> None:
        if not self.told and self.inlet.dropped:
            self.told = True
            super().handle(_record("the gateway's log cannot keep up (stderr is not read fast enough): lines dropped"))
        super().handle(record)

    def enqueue_sentinel(self) -> None:
        # The stdlib's puts without waiting, and raises on a full queue: this one waits for
        # room (stop() runs it in a thread of its own). None is QueueListener's sentinel.
        self.records.put(None)


class GatewayLog:
    """``with GatewayLog(worker):`` the process's log (the root logger's, at WARNING, logging's
    handler of last resort and Python's warnings) goes through the queue to stderr; at the
    end, stopped within STOP_TIMEOUT and logging as it was."""

    def __init__(self, worker: int | None = None, *, err: TextIO | None = None, capacity: int = QUEUE_RECORDS) -> None:
        records: queue.Queue[logging.LogRecord | None] = queue.Queue(capacity)
        self._inlet = _Inlet(records)
        self._writer = _Writer(records, log_handler(err if err is not None else stderr(), worker), self._inlet)
        self._stopped = threading.Event()
        self._level = logging.NOTSET
        self._last_resort: logging.Handler | None = None
        self._unraisable = sys.unraisablehook
        self.last = ""  # a line written as it is when the log stops, after all else (the gateway's "stopped")

    @property
    def dropped(self) -> int:
        return self._inlet.dropped

    def __enter__(self) -> GatewayLog:
        root = logging.getLogger()
        self._level = root.level
        root.addHandler(self._inlet)
        root.setLevel(logging.WARNING)
        # What a logger that does not propagate and has no handler of its own logs (uvicorn's
        # access logger) would go to logging's handler of last resort: sys.stderr, directly.
        self._last_resort, logging.lastResort = logging.lastResort, self._inlet
        logging.captureWarnings(True)  # warnings.showwarning writes to sys.stderr itself
        self._unraisable, sys.unraisablehook = sys.unraisablehook, _unraisable  # as does this one
        self._writer.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        root = logging.getLogger()
        if self._stop():
            logging.captureWarnings(False)
            sys.unraisablehook = self._unraisable
            logging.lastResort = self._last_resort
            root.removeHandler(self._inlet)
        else:
            # The writer is stuck in a write, holding its handler's lock: logging's flush of
            # every handler at exit would wait for it for ever. And everything stays routed
            # through the queue, so that nothing logged from now on waits on stderr either.
            atexit.unregister(logging.shutdown)
        root.setLevel(self._level)

    def _stop(self) -> bool:
        """Hand the writer the count of what was dropped (if any), the last line, then its
        end; wait for it at most STOP_TIMEOUT. Returns whether it finished."""
        # Each step may wait for the writer (for room in the queue, for its thread to end;
        # QueueListener.stop() waits without a bound): in a thread of its own.
        stopping = threading.Thread(target=self._finish, name="capmon-log-stop", daemon=True)
        stopping.start()
        stopping.join(STOP_TIMEOUT)
        return self._stopped.is_set()

    def _finish(self) -> None:
        last = []
        if self._inlet.dropped:
            last.append(_record(f"{self._inlet.dropped} line(s) of the gateway's log dropped in all"))
        if self.last:
            last.append(_record(self.last, logging.INFO, plain=True))
        for record in last:
            self._writer.records.put(self._inlet.prepare(record))
        self._writer.stop()
        self._stopped.set()
