"""The gateway's traces: the real openai SDK against a gateway on the simulator, its spans
caught by the SDK's in-memory exporter (a plain answer, a stream, a fallback, a failure,
a client's traceparent continued) and, configured by ``[telemetry] otlp_endpoint`` as a
user would, sent by OTLP/HTTP to a receiver this test runs and decodes. Without the otel
extra, ``capmon serve`` says in one line what to install; without ``[telemetry]`` nothing
of OpenTelemetry is imported."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from capmon.cli import main
from capmon.core.base.exceptions import ConfigError
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import parse_config
from capmon.gateway import close_app, create_app, load_settings, start_server
from capmon.gateway.trace_relay import RESTART_AFTER, RelayExporter
from capmon.gateway.traces import GatewayTraces, otlp_url, resource
from capmon.sim.scenario import Scenario
from capmon.sim.server import start_simulator
from tests.gateway.helpers import ENV, HELLO, Running, config, gateway_for, scenario, serve_process, until
from tests.support.configs import config_toml, shipped_config
from tests.support.scripted import free_port
from tests.support.simulated import StartSim

ROOT = Path(__file__).resolve().parents[2]
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
MINIMAL = config_toml("http://127.0.0.1:1/v1", endpoint="e", keys=[("K", None)], models=["m"])


@contextlib.asynccontextmanager
async def traced(scn: Scenario | None = None, **config_kw: Any) -> AsyncIterator[tuple[Running, InMemorySpanExporter]]:
    """A gateway on the simulator (``scn``) whose spans go to an in-memory exporter, one by one."""
    exporter = InMemorySpanExporter()
    sim = await start_simulator(scn or scenario())
    try:
        cfg = config(sim.base_url, **config_kw)
        async with FallbackClient(cfg, environ=ENV) as client:
            provider = TracerProvider(resource=resource(cfg))
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            settings = load_settings(cfg, listen="127.0.0.1:0", environ=ENV)
            app = create_app(client, settings, tracer=GatewayTraces(provider, client))
            server = await start_server(app, "127.0.0.1", 0)
            try:
                yield Running(sim, client, app, server), exporter
            finally:
                close_app(app)
                await server.stop()
    finally:
        await sim.stop()


async def spans_of(exporter: InMemorySpanExporter, requests: int) -> list[ReadableSpan]:
    """The finished spans once ``requests`` request spans are there (made when each reply is done)."""
    await until(
        lambda: sum(s.kind is SpanKind.SERVER for s in exporter.get_finished_spans()) >= requests, "request spans"
    )
    return list(exporter.get_finished_spans())


def tree(spans: list[ReadableSpan]) -> list[tuple[ReadableSpan, list[ReadableSpan]]]:
    """Each request span with its attempt spans, in the order they were made."""
    out = []
    for root in (s for s in spans if s.kind is SpanKind.SERVER):
        assert root.context is not None
        children = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
        out.append((root, sorted(children, key=lambda s: s.start_time or 0)))
    return out


def no_text(spans: list[ReadableSpan], *texts: str) -> None:
    """No prompt, answer or key in any attribute."""
    values = " ".join(str(v) for s in spans for v in (s.attributes or {}).values())
    for text in texts:
        assert text not in values


@pytest.mark.looptime
async def test_a_request_span_with_its_attempt_a_stream_a_failure_and_a_messages_request() -> None:
    async with traced() as (gw, exporter), gw.openai() as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(model="flagship", messages=HELLO, max_tokens=8)
        reply = raw.parse()
        stream = await sdk.chat.completions.create(
            model="medium", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
        with pytest.raises(Exception, match="does not exist"):
            await sdk.chat.completions.create(model="no-such-model-xyz", messages=HELLO)
        await gw.http().get("/health")
        async with gw.anthropic() as claude:
            message = await claude.messages.create(model="small", max_tokens=8, messages=HELLO)
        spans = await spans_of(exporter, 4)
    (plain, [attempt]), (streamed, [stream_attempt]), (failed, no_attempts), (messages, [_]) = tree(spans)
    assert len(spans) == 7 and no_attempts == []  # /health has none
    assert plain.name == "chat flagship" and attempt.name == "chat sim-flagship" and attempt.kind is SpanKind.CLIENT
    assert plain.attributes is not None and attempt.attributes is not None and reply.usage is not None
    assert dict(plain.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "flagship",
        "gen_ai.response.model": "sim-flagship",
        "gen_ai.usage.input_tokens": reply.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": 8,
        "gen_ai.usage.cache_read.input_tokens": 0,
        "http.response.status_code": 200,
        "url.path": "/v1/chat/completions",
        "capmon.request_id": raw.headers["x-request-id"],
        "capmon.model": "flagship",
        "capmon.deployment": "sim-flagship",
        "capmon.attempts": 1,
        "capmon.fallbacks": 0,
        "capmon.priority": "interactive",
        "capmon.ttfb_s": plain.attributes["capmon.ttfb_s"],
        "capmon.wait_s": plain.attributes["capmon.wait_s"],
    }
    assert dict(attempt.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "sim-flagship",
        "gen_ai.response.model": "sim-flagship",
        "server.address": "127.0.0.1",
        "server.port": int(gw.sim.base_url.split(":")[-1].split("/")[0]),
        "http.response.status_code": 200,
        "capmon.model": "flagship",
        "capmon.endpoint": "sim",
        "capmon.deployment": "sim-flagship",
        "capmon.decision": "ok",
        "capmon.breaker_state": "closed",
    }
    assert plain.status.status_code is StatusCode.UNSET and attempt.status.status_code is StatusCode.UNSET
    # the attempt lies within its request, and the trace is one
    assert plain.context is not None and attempt.context is not None and plain.parent is None
    assert attempt.context.trace_id == plain.context.trace_id
    assert plain.start_time is not None and plain.end_time is not None
    assert attempt.start_time is not None and attempt.end_time is not None
    assert plain.start_time <= attempt.start_time < attempt.end_time <= plain.end_time
    assert float(plain.attributes["capmon.wait_s"]) < 0.1  # nobody waited: the model had room
    # the stream: its usage is the one the last chunk told
    usage = chunks[-1].usage
    assert usage is not None and streamed.name == "chat medium" and streamed.attributes is not None
    assert streamed.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert streamed.attributes["gen_ai.response.model"] == "sim-medium"
    assert stream_attempt.attributes is not None and stream_attempt.attributes["capmon.decision"] == "ok"
    # a model nobody configured: no model in the span's name (a client cannot name spans), the error's kind
    assert failed.name == "chat" and failed.attributes is not None
    assert (
        failed.attributes["error.type"] == "model_not_found" and failed.attributes["http.response.status_code"] == 404
    )
    assert "gen_ai.request.model" not in failed.attributes and failed.status.status_code is StatusCode.ERROR
    # Anthropic's Messages API: its own usage words
    assert messages.name == "chat small" and messages.attributes is not None
    assert messages.attributes["url.path"] == "/v1/messages"
    assert (messages.attributes["gen_ai.usage.input_tokens"], messages.attributes["gen_ai.usage.output_tokens"]) == (
        message.usage.input_tokens,
        message.usage.output_tokens,
    )
    no_text(spans, HELLO[0]["content"], reply.choices[0].message.content or "?", "sk-capmon")


@pytest.mark.looptime
async def test_a_fallback_is_a_request_span_with_both_attempts_and_a_traceparent_is_continued() -> None:
    async with traced() as (gw, exporter), gw.openai() as sdk:
        await gw.sim_admin("outage/sim-flagship", {"duration": 60})
        raw = await sdk.chat.completions.with_raw_response.create(
            model="flagship", messages=HELLO, extra_headers={"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"}
        )
        # a client that does not sample this trace: the gateway records nothing of it
        await sdk.chat.completions.create(
            model="flagship", messages=HELLO, extra_headers={"traceparent": f"00-{'1' * 32}-{'2' * 16}-00"}
        )
        spans = await spans_of(exporter, 1)
    assert raw.headers["x-capmon-fallbacks"] == "1"
    [(request, [first, second])] = tree(spans)
    assert len(spans) == 3
    assert request.context is not None and request.parent is not None and request.parent.is_remote
    assert f"{request.context.trace_id:032x}" == PARENT_TRACE and f"{request.parent.span_id:016x}" == PARENT_SPAN
    assert request.attributes is not None and first.attributes is not None and second.attributes is not None
    assert (request.attributes["capmon.fallbacks"], request.attributes["capmon.attempts"]) == (1, 2)
    assert (request.attributes["gen_ai.request.model"], request.attributes["capmon.model"]) == ("flagship", "medium")
    assert request.attributes["gen_ai.response.model"] == "sim-medium" and "error.type" not in request.attributes
    assert (first.name, first.attributes["error.type"], first.attributes["capmon.decision"]) == (
        "chat sim-flagship",
        "capacity",
        "fallback",
    )
    assert first.attributes["http.response.status_code"] == 503 and first.status.status_code is StatusCode.ERROR
    assert "gen_ai.usage.output_tokens" not in first.attributes
    assert (second.name, second.attributes["capmon.decision"], second.attributes["capmon.model"]) == (
        "chat sim-medium",
        "ok",
        "medium",
    )
    assert first.end_time is not None and second.start_time is not None and first.end_time <= second.start_time


@pytest.mark.looptime
async def test_a_name_an_alias_pattern_matches_is_the_spans_requested_model() -> None:
    async with traced(gateway='aliases = { "claude-*" = "medium" }') as (gw, exporter), gw.openai() as sdk:
        await sdk.chat.completions.create(model="claude-opus-4-8", messages=HELLO)
        with pytest.raises(openai.NotFoundError):
            await sdk.chat.completions.create(model="llama-3", messages=HELLO)
        spans = await spans_of(exporter, 2)
    (served, _), (unknown, _) = tree(spans)
    assert served.attributes is not None and unknown.attributes is not None
    assert (served.name, served.attributes["gen_ai.request.model"], served.attributes["capmon.model"]) == (
        "chat claude-opus-4-8",
        "claude-opus-4-8",
        "medium",
    )
    assert unknown.name == "chat" and "gen_ai.request.model" not in unknown.attributes  # no name it does not know


async def test_a_model_passed_over_is_an_event_of_the_request_span_not_a_call() -> None:
    async with traced() as (gw, exporter), gw.openai() as sdk:
        gw.client.trip("flagship", "maintenance")
        await sdk.chat.completions.create(model="auto", messages=HELLO)
        spans = await spans_of(exporter, 1)
    ((root, calls),) = tree(spans)
    assert root.attributes is not None
    assert list(root.attributes["capmon.skipped"]) == ["flagship@sim/sim-key=tripped"]  # type: ignore[arg-type]
    (event,) = [e for e in root.events if e.name == "capmon.skip"]
    assert event.attributes is not None and event.attributes["capmon.skip"] == "tripped"
    assert str(event.attributes["capmon.reason"]).startswith("tripped: tripped by hand (maintenance)")
    assert [c.attributes["capmon.model"] for c in calls if c.attributes] == ["medium"]  # no span for the skip


# ---------------------------------------------------------------- OTLP/HTTP, as configured


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[ExportTraceServiceRequest], list[str]]]:
    """A collector's OTLP/HTTP traces endpoint on a free loopback port: what it was sent, decoded."""
    got: list[ExportTraceServiceRequest] = []
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["content-length"]))
            seen.append(f"{self.path} {self.headers['content-type']}")
            got.append(ExportTraceServiceRequest.FromString(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", got, seen
    finally:
        server.shutdown()
        server.server_close()


def _value(v: AnyValue) -> Any:
    return getattr(v, v.WhichOneof("value") or "string_value")


@pytest.mark.looptime
async def test_the_attempt_spans_of_a_fallback_reach_an_otlp_receiver(start_sim: StartSim) -> None:
    with otlp_receiver() as (url, got, seen):
        sim = await start_sim(scenario())
        telemetry = f'[telemetry]\notlp_endpoint = "{url}"\nservice_name = "gw-under-test"\n'
        async with gateway_for(sim.base_url, extra=telemetry) as (client, app, server):
            assert isinstance(app.state.gateway.tracer, GatewayTraces)  # from the config alone
            gw = Running(sim, client, app, server)
            await gw.sim_admin("outage/sim-flagship", {"duration": 60})
            async with gw.openai() as sdk:
                raw = await sdk.chat.completions.with_raw_response.create(model="flagship", messages=HELLO)
        # the gateway has stopped: its last spans were flushed on the way out
    assert seen and all(s == "/v1/traces application/x-protobuf" for s in seen)
    spans, services = [], set()
    for request in got:
        for rs in request.resource_spans:
            services |= {_value(a.value) for a in rs.resource.attributes if a.key == "service.name"}
            spans += [s for ss in rs.scope_spans for s in ss.spans]
    assert services == {"gw-under-test"}
    attrs = {s.span_id: {a.key: _value(a.value) for a in s.attributes} for s in spans}
    [root] = [s for s in spans if s.kind == s.SPAN_KIND_SERVER]
    assert attrs[root.span_id]["capmon.request_id"] == raw.headers["x-request-id"]
    assert attrs[root.span_id]["capmon.fallbacks"] == 1
    children = sorted((s for s in spans if s.parent_span_id == root.span_id), key=lambda s: s.start_time_unix_nano)
    assert [(s.name, s.kind == s.SPAN_KIND_CLIENT) for s in children] == [
        ("chat sim-flagship", True),
        ("chat sim-medium", True),
    ]
    assert [attrs[s.span_id].get("error.type") for s in children] == ["capacity", None]
    assert all(s.trace_id == root.trace_id for s in children)


FAST_SCENARIO = 'name = "fast"\n' + "".join(
    f'[[models]]\nname = "sim-{m}"\nslots = 16\nbase_latency = 0.02\nper_token = 0.0\nnoise = 0.0\n'
    f"answer_tokens = 8\ncontext_window = 200000\n{api}"
    for m, api in (("flagship", ""), ("claude", 'api = "anthropic"\n'), ("medium", ""), ("small", ""))
)


def test_capmon_serve_exports_a_fallback_across_providers_and_flushes_it_when_stopped(tmp_path: Path) -> None:
    """The shipped config (flagship, then claude on Anthropic's wire) with [telemetry], as a user runs it."""
    port = free_port()
    with otlp_receiver() as (url, got, _):
        config, sim = shipped_config(tmp_path, FAST_SCENARIO, extra=f'\n[telemetry]\notlp_endpoint = "{url}"\n')
        proc = serve_process(config, port, cwd=tmp_path, drop=("CAPMON_", "OTEL_"))
        try:
            assert proc.stdout is not None
            banner = proc.stdout.readline()
            assert f"; traces to {url};" in banner, proc.stderr.read() if proc.stderr else ""
            httpx.post(f"http://127.0.0.1:{sim}/admin/outage/sim-flagship", json={"duration": 60}).raise_for_status()
            sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="any", max_retries=0)
            raw = sdk.chat.completions.with_raw_response.create(model="flagship", messages=HELLO)
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "Traceback" not in err, err
    assert (raw.headers["x-capmon-model"], raw.headers["x-capmon-fallbacks"]) == ("claude", "1")
    spans = [s for request in got for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    attrs = {s.span_id: {a.key: _value(a.value) for a in s.attributes} for s in spans}
    [root] = [s for s in spans if s.kind == s.SPAN_KIND_SERVER]  # sent when the gateway stopped: batched
    children = sorted((s for s in spans if s.parent_span_id == root.span_id), key=lambda s: s.start_time_unix_nano)
    assert attrs[root.span_id]["capmon.request_id"] == raw.headers["x-request-id"]
    assert attrs[root.span_id]["gen_ai.provider.name"] == "anthropic"
    assert [
        (s.name, attrs[s.span_id]["gen_ai.provider.name"], attrs[s.span_id].get("error.type")) for s in children
    ] == [
        ("chat sim-flagship", "openai", "capacity"),
        ("chat sim-claude", "anthropic", None),
    ]


def test_a_relay_that_died_costs_spans_not_answers_and_is_started_again() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span("chat m", attributes={"capmon.fallbacks": 1}).end()
    spans = exporter.get_finished_spans()
    with otlp_receiver() as (url, got, _):
        relay = RelayExporter(otlp_url(url), "relayed", 5.0)
        assert relay.proc is not None
        relay.proc.kill()
        relay.proc.wait()
        assert relay.export(spans) is SpanExportResult.FAILURE  # dropped, not raised
        relay.started -= RESTART_AFTER  # as if it had run for a while before it died
        assert relay.export(spans) is SpanExportResult.SUCCESS
        relay.shutdown()  # sends what it has, then ends
    [request] = got
    [span] = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert span.name == "chat m" and [(a.key, _value(a.value)) for a in span.attributes] == [("capmon.fallbacks", 1)]
    assert relay.proc is None


# ---------------------------------------------------------------- config and the extra


def test_the_collector_address_is_checked_and_never_echoes_a_secret() -> None:
    base = MINIMAL + "[telemetry]\n"
    with pytest.raises(ConfigError, match=r"^t\.toml: telemetry\.otlp_endpoint: expected an http:// or https:// URL"):
        parse_config(base + 'otlp_endpoint = "collector:4318"\n', "t.toml")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_HEADERS") as e:
        parse_config(base + 'otlp_endpoint = "https://user:s3cr3t-tok@collector:4318"\n', "t.toml")
    assert "s3cr3t" not in str(e.value)
    with pytest.raises(ConfigError, match=r"telemetry\.endpoint: unknown key; did you mean 'otlp_endpoint'"):
        parse_config(base + 'endpoint = "http://c:4318"\n', "t.toml")
    assert parse_config(base, "t.toml").telemetry.otlp_endpoint == ""
    assert otlp_url("http://c:4318") == otlp_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert otlp_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"


def test_serve_without_the_extra_says_what_to_install_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(MINIMAL + '[telemetry]\notlp_endpoint = "http://127.0.0.1:4318"\n')
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if the extra were not installed
    assert main(["serve", "--config", str(cfg), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"capmon: {cfg}: telemetry.otlp_endpoint needs the otel extra: pip install 'capmon[otel]'"


NOTHING_WITHOUT_TELEMETRY = """
import asyncio, sys
from capmon.core.types.config import parse_config
from capmon.core.routing.client import FallbackClient
from capmon.gateway import close_app, create_app, load_settings

async def main():
    cfg = parse_config(sys.argv[1])
    async with FallbackClient(cfg, environ={"K": "k"}) as client:
        app = create_app(client, load_settings(cfg, listen="127.0.0.1:0", environ={}))
        assert app.state.gateway.tracer is None
        close_app(app)

asyncio.run(main())
print(sorted(n for n in sys.modules if n.startswith(("opentelemetry", "capmon.gateway.traces"))))
"""


def test_without_telemetry_nothing_of_opentelemetry_is_imported() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NOTHING_WITHOUT_TELEMETRY, MINIMAL],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.looptime
async def test_the_request_span_carries_the_answers_cost_at_its_models_prices() -> None:
    prices = {"flagship": {"input": 3.0, "output": 15.0, "cached_input": 0.3}}
    async with traced(prices=prices) as (gw, exporter), gw.openai() as sdk:
        reply = await sdk.chat.completions.create(model="flagship", messages=HELLO, max_tokens=8)
        unpriced = await sdk.chat.completions.create(model="medium", messages=HELLO, max_tokens=8)
        spans = await spans_of(exporter, 2)
    (priced_span, [attempt]), (medium_span, _) = tree(spans)
    assert reply.usage is not None and unpriced.usage is not None
    assert priced_span.attributes is not None and medium_span.attributes is not None and attempt.attributes
    expected = (reply.usage.prompt_tokens * 3.0 + reply.usage.completion_tokens * 15.0) / 1e6
    assert priced_span.attributes["capmon.cost_usd"] == pytest.approx(expected)
    assert "capmon.cost_usd" not in attempt.attributes  # the request's only: summed over spans, it counts once
    assert "capmon.cost_usd" not in medium_span.attributes  # no price: no cost, never 0
    assert medium_span.attributes["gen_ai.usage.input_tokens"] == unpriced.usage.prompt_tokens
