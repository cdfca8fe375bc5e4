"""The gateway's spans exported from a process of their own.

OTLP's encoder is Python: about 60 µs of CPU per span, under the GIL, in the batch
processor's thread, while the event loop waits for the GIL up to the interpreter's 5 ms
switch interval at a time. At 500 requests a second on a shared 2-core machine the loop's
p99 lag was 2 to 3 times as long with the spans encoded in process as with them relayed
(and relayed, about what making the spans alone costs). So the gateway's BatchSpanProcessor hands each batch to
:class:`RelayExporter`, which only flattens the spans to plain values (``marshal``, about
7 µs a span) and writes them to a pipe; the relay (capmon/gateway/relay_process.py) at the
other end rebuilds them and sends them with OpenTelemetry's own OTLP/HTTP exporter (its
standard variables, OTEL_EXPORTER_OTLP_HEADERS included, read there).

The relay gets its own session and ignores SIGINT and SIGTERM, so a stop meant for the
gateway does not cut it short: it ends when the pipe closes (the gateway stopping, or
dying), after sending what it has.
"""

from __future__ import annotations

import logging
import marshal
import subprocess
import sys
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from capmon import __version__
from capmon.core.base.clock import default_clock
from capmon.gateway import relay_process
from capmon.gateway.relay_process import FRAME, Plain

log = logging.getLogger("capmon.gateway")

RESTART_AFTER = 10.0  # seconds before a relay that died is started again (its batches meanwhile dropped)
STOP_WAIT = 6.0  # seconds the gateway, stopping, waits for the relay to send what it has


def plain(span: ReadableSpan) -> Plain:
    """What the gateway's spans carry, as values marshal writes (relay_process.Plain says
    which, and rebuilds them)."""
    c, p = span.context, span.parent
    assert c is not None
    return (
        span.name,
        c.trace_id,
        c.span_id,
        int(c.trace_flags),
        c.trace_state.to_header(),
        None if p is None else (p.trace_id, p.span_id, p.is_remote, int(p.trace_flags)),
        span.kind.value,
        span.start_time,
        span.end_time,
        dict(span.attributes or {}),
        span.status.status_code.value,
        span.status.description,
    )


class RelayExporter(SpanExporter):
    """A SpanExporter whose batches go to the relay process (started here)."""

    def __init__(self, endpoint: str, service_name: str, timeout: float) -> None:
        # -P: the file's folder is not put on the path (its modules would shadow the stdlib's)
        script = relay_process.__file__
        self.argv = [sys.executable, "-P", script, endpoint, service_name, __version__, str(timeout)]
        self.clock = default_clock()  # in the batch processor's thread: monotonic time
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self._start()

    def _start(self) -> None:
        self.started = self.clock.now()
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = marshal.dumps([plain(s) for s in spans])
        proc = self.proc
        if proc is None or proc.poll() is not None:
            if proc is None or self.clock.now() - self.started < RESTART_AFTER:
                return SpanExportResult.FAILURE  # stopped, or died lately: dropped until it is started again
            log.warning("the traces' relay process exited (code %s); starting it again", proc.returncode)
            self._start()
            proc = self.proc
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(FRAME.pack(len(data)) + data)
            proc.stdin.flush()
        except OSError as e:  # the relay died since the last batch
            log.warning("the traces' relay process is gone (%s); spans are dropped until it is back", e)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()  # the relay's end of input: it sends what it has, then exits
            except OSError:
                pass
        try:
            proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            log.warning("the traces' relay did not finish within %gs; its last spans are lost", STOP_WAIT)
            proc.kill()
            proc.wait()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        del timeout_millis  # the SpanExporter interface's; a batch is in the pipe once export returns
        return True
