"""``capmon serve`` with traces on: benchmarks/gateway.py's run, its gateway's config with
``[telemetry] otlp_endpoint`` set to a collector this process runs, which takes every
OTLP/HTTP export (and decodes them only after the run, to count the spans).

    python -m benchmarks.gateway_traces [benchmarks.gateway's options: --rates 500 --rows direct capmon ...]

Read its "capmon serve" row against a run of benchmarks.gateway made just before or after
on the same machine: the difference is what traces cost (every request sampled: the
SDK's default). Needs the otel extra (`pip install -e '.[otel]'`).
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks import gateway


class Collector(ThreadingHTTPServer):
    """OTLP/HTTP's traces endpoint on a free loopback port, keeping what it is sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> int:
        return sum(
            len(ss.spans)
            for body in self.bodies
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans
            for ss in rs.scope_spans
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Collector

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.server.bodies.append(self.rfile.read(int(self.headers["content-length"])))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    collector = Collector()
    threading.Thread(target=collector.serve_forever, name="collector", daemon=True).start()
    gateway.CAPMON_SET = (*gateway.CAPMON_SET, f"telemetry.otlp_endpoint={collector.url}")
    try:
        code = gateway.main(argv)
    finally:
        collector.shutdown()
    print(f"<!-- the collector took {len(collector.bodies)} exports, {collector.spans()} spans -->")
    return code


if __name__ == "__main__":
    sys.exit(main())
