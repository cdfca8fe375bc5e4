"""The traces' relay process (capmon/gateway/trace_relay.py starts it): batches of the
gateway's spans, flattened, on stdin; sent on with OpenTelemetry's own OTLP/HTTP exporter
(its standard variables, OTEL_EXPORTER_OTLP_HEADERS included, read here).

Run as a file, ``python -P relay_process.py ENDPOINT SERVICE_NAME VERSION TIMEOUT``, and so
it imports nothing of capmon: the relay starts in a third of a second, without the
gateway's own imports. It ends at the end of its input (the gateway stopping, or dying),
after sending what it was given.
"""

from __future__ import annotations

import logging
import marshal
import signal
import struct
import sys
from collections.abc import Callable
from typing import IO, Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

FRAME = struct.Struct("!I")  # each batch: its length, then its marshal bytes
SCOPE = "capmon.gateway"

# One span, as trace_relay.plain writes it: name, trace id, span id, trace flags, trace
# state (its header), parent (trace id, span id, remote, flags) or None, kind, start and
# end (ns), attributes, status code, status description. No events, no links.
Plain = tuple[Any, ...]


def rebuilt(t: Plain, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    name, trace_id, span_id, flags, state, parent, kind, start, end, attrs, code, description = t
    context = SpanContext(trace_id, span_id, False, TraceFlags(flags), TraceState.from_header([state] if state else []))
    up = None if parent is None else SpanContext(parent[0], parent[1], parent[2], TraceFlags(parent[3]))
    return ReadableSpan(
        name,
        context,
        up,
        resource,
        attrs,
        kind=SpanKind(kind),
        status=Status(StatusCode(code), description),
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


def _read(stream: IO[bytes], n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def main(argv: list[str]) -> int:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint, service_name, version, timeout = argv[0], argv[1], argv[2], float(argv[3])
    # A stop meant for the gateway (Ctrl+C, a service manager's SIGTERM to the group) is the
    # gateway's: it closes the pipe when it has handed over its last spans, and that ends this.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="capmon gateway: %(levelname)s traces: %(message)s")
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
    resource = Resource.create({"service.name": service_name, "service.version": version})
    scope = InstrumentationScope(SCOPE, version)
    stdin = sys.stdin.buffer
    while (head := _read(stdin, FRAME.size)) is not None:
        body = _read(stdin, FRAME.unpack(head)[0])
        if body is None:
            break
        exporter.export([rebuilt(t, resource, scope) for t in marshal.loads(body)])
    stop: Callable[[], object] = exporter.shutdown  # untyped in some SDK versions, typed in others
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
