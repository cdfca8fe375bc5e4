"""A provider's usage is bounded before anyone reads it: a simulated model that reports 10^30
tokens (or negative, float or string counts) on every wire, plain and streamed, same format
and across formats, through the real SDKs and the gateway: the library's result, the
gateway's replies, its access log and its spans carry counts from 0 to 2^53 - 1 or none;
and the trace relay sends the span without a traceback."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from capmon.core.providers.usage import MAX_COUNT
from capmon.core.types.result import Request
from capmon.sim.usage import HUGE, USAGE_MODES
from tests.gateway.helpers import HELLO, Running, data_of, gateway_for, scenario, spec, sse_frames
from tests.gateway.test_traces import otlp_receiver, spans_of, traced
from tests.support.simulated import StartSim

HOSTILE = [m for m in USAGE_MODES if m != "honest"]
USAGE_ATTRIBUTES = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
SIM_MODELS = ("sim-flagship", "sim-medium", "sim-small")


def counts_of(usage: Any, where: str) -> list[tuple[str, Any]]:
    """Every count (``*_tokens``, ``*_requests``) in a usage object, at any depth."""
    assert usage is None or isinstance(usage, dict), (where, usage)
    out = []
    for name, value in (usage or {}).items():
        if isinstance(value, dict):
            out += counts_of(value, f"{where}.{name}")
        elif name.endswith(("_tokens", "_requests")):
            out.append((f"{where}.{name}", value))
    return out


def assert_sane(usage: Any, where: str) -> None:
    for name, value in counts_of(usage, where):
        assert type(value) is int and 0 <= value <= MAX_COUNT, (name, value)


def usages_in(text: str) -> list[Any]:
    """The usage objects of a stream's events (a chunk's, a message_start's message's, a response's)."""
    found = []
    for event in data_of(sse_frames(text)):
        for holder in (event, event.get("message"), event.get("response")):
            if isinstance(holder, dict) and "usage" in holder:
                found.append(holder["usage"])
    return found


async def hostile(gw: Running, mode: str) -> None:
    for model in SIM_MODELS:
        await gw.sim_admin(f"models/{model}", {"usage": mode})


MESSAGES = {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
WITH_USAGE = {"stream": True, "stream_options": {"include_usage": True}}
ANTHROPIC = {"anthropic-version": "2023-06-01"}


@pytest.mark.looptime
@pytest.mark.parametrize("mode", HOSTILE)
async def test_hostile_usage_reaches_the_client_the_log_and_a_span_bounded(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    where = tmp_path / "access.jsonl"
    # flagship and medium on the OpenAI wire, small on Anthropic's
    scn = scenario(spec("flagship"), spec("medium"), spec("small", api="anthropic"))
    async with traced(scn, anthropic=("small",), gateway=f'access_log = "{where}"') as (gw, exporter):
        await hostile(gw, mode)
        result = await gw.client.chat(Request.of(HELLO, model="flagship"))
        streamed = await gw.client.chat(Request.of(HELLO, model="small"))  # translated from Messages
        async with gw.http() as http:
            chat = await http.post("/v1/chat/completions", json={"model": "flagship", "messages": HELLO})
            chat_stream = await http.post(
                "/v1/chat/completions",
                json={"model": "flagship", "messages": HELLO, **WITH_USAGE},
            )
            across = await http.post("/v1/chat/completions", json={"model": "small", "messages": HELLO})
            across_stream = await http.post(
                "/v1/chat/completions",
                json={"model": "small", "messages": HELLO, **WITH_USAGE},
            )
            responses = await http.post("/v1/responses", json={"model": "medium", "input": "hi"})
            responses_stream = await http.post("/v1/responses", json={"model": "medium", "input": "hi", "stream": True})
            messages = await http.post("/v1/messages", headers=ANTHROPIC, json={"model": "small", **MESSAGES})
            messages_stream = await http.post(
                "/v1/messages", headers=ANTHROPIC, json={"model": "small", "stream": True, **MESSAGES}
            )
            messages_across = await http.post("/v1/messages", headers=ANTHROPIC, json={"model": "medium", **MESSAGES})
        plain = (chat, across, responses, messages, messages_across)
        streams = (chat_stream, across_stream, responses_stream, messages_stream)
        spans = await spans_of(exporter, len(plain) + len(streams))
    assert all(r.status_code == 200 for r in (*plain, *streams)), [r.text for r in (*plain, *streams)]
    assert_sane(dict(result.usage), "the library's result")
    assert_sane(dict(streamed.usage), "the library's translated result")
    seen = 0
    for reply in plain:
        assert "usage" in reply.json() or mode != "huge"
        assert_sane(reply.json().get("usage"), reply.request.url.path)
        seen += 1
    for reply in streams:
        found = usages_in(reply.text)
        assert found, reply.text
        for usage in found:
            assert_sane(usage, f"{reply.request.url.path} stream")
        seen += 1
    assert seen == 9
    # the wire's own words, same format: the garbage is left out, not passed on, not made 0
    assert counts_of(chat.json()["usage"], "chat") == [] and counts_of(result.usage, "result") == []
    lines = [json.loads(line) for line in where.read_text().splitlines()]
    assert len(lines) == 9
    for line in lines:
        for field in ("tokens_in", "tokens_out"):
            value = line[field]
            assert value is None or (type(value) is int and 0 <= value <= MAX_COUNT), line
    assert lines[0]["tokens_in"] is None and lines[0]["tokens_out"] is None  # chat: flagship said nothing sane
    for span in spans:
        for name in USAGE_ATTRIBUTES:
            value = (span.attributes or {}).get(name)
            assert value is None or (type(value) is int and 0 <= value <= MAX_COUNT), (span.name, name, value)
    encode_spans(spans)  # what the relay does with them: OTLP's int64 holds every value
    # capmon's own and the trace exporter's logs: another test's client collected here by the
    # garbage collector may log its own troubles (an SDK's aclose on a closed loop) meanwhile.
    ours = [r for r in caplog.records if r.name.startswith(("capmon", "opentelemetry"))]
    errors = [r.getMessage() for r in ours if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, errors


@pytest.mark.looptime
async def test_the_trace_relay_sends_the_span_of_an_answer_claiming_10_to_the_30_tokens(
    capfd: pytest.CaptureFixture[str], start_sim: StartSim
) -> None:
    with otlp_receiver() as (url, got, _):
        sim = await start_sim(scenario())
        telemetry = f'[telemetry]\notlp_endpoint = "{url}"\nservice_name = "gw-under-test"\n'
        async with gateway_for(sim.base_url, extra=telemetry) as (client, app, server):
            gw = Running(sim, client, app, server)
            await hostile(gw, "huge")
            async with gw.http() as http:
                reply = await http.post("/v1/chat/completions", json={"model": "flagship", "messages": HELLO})
        # the gateway has stopped: the relay sent what it had, then exited
    assert reply.status_code == 200 and str(HUGE) not in reply.text
    spans = [s for request in got for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    [root] = [s for s in spans if s.kind == s.SPAN_KIND_SERVER]
    assert not {a.key for a in root.attributes} & set(USAGE_ATTRIBUTES)
    err = capfd.readouterr().err
    assert "Traceback" not in err, err  # the relay's, had it failed to encode the span
