"""An endpoint that cannot be reached (a name that does not resolve, a refused port, TLS
spoken to a plain-HTTP server) is not "at capacity": a request is answered at once with a
502 ``upstream_unreachable`` naming the endpoint and the cause, /ready says so, the log has
one line per endpoint and cause, and the endpoint serves again once it answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest

from capmon.sim.server import start_simulator
from tests.gateway.helpers import HELLO, gateway_for, scenario, serve_process
from tests.support.configs import NO_SUCH_HOST, write_config
from tests.support.scripted import free_port
from tests.support.simulated import StartSim

pytestmark = pytest.mark.looptime


@contextlib.asynccontextmanager
async def _plain_http() -> AsyncIterator[int]:
    """A plain-HTTP server (the simulator): spoken to over https, its TLS handshake fails."""
    sim = await start_simulator(scenario())
    try:
        yield sim.port
    finally:
        await sim.stop()


CASES = {"dns": "DNS lookup failed", "refused": "connection refused", "tls": "TLS handshake failed"}


@contextlib.asynccontextmanager
async def _base_url(case: str) -> AsyncIterator[str]:
    if case == "dns":
        yield "https://capmon-no-such-host.invalid/v1"
    elif case == "refused":
        yield f"http://127.0.0.1:{free_port()}/v1"
    else:
        async with _plain_http() as port:
            yield f"https://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("case", sorted(CASES))
async def test_an_unreachable_endpoint_is_a_502_at_once_never_capacity(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    label = CASES[case]
    caplog.set_level(logging.WARNING, logger="capmon.client")
    async with _base_url(case) as base, gateway_for(base, models=("flagship",)) as (_client, _app, server):
        # The SDK as a user has it: its own retries on, no deadline header.
        sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="k")
        loop = asyncio.get_running_loop()
        for _ in range(5):
            t0 = loop.time()
            with pytest.raises(openai.APIStatusError) as info:
                await sdk.chat.completions.create(model="auto", messages=HELLO)
            assert loop.time() - t0 < 2.0  # no wait for a probe, no retry by the SDK
            r = info.value.response
            err = r.json()["error"]
            assert r.status_code == 502, r.text
            assert err["code"] == "upstream_unreachable" and err["type"] == "upstream_error"
            assert "endpoint sim" in err["message"] and label in err["message"]
            assert "capacity" not in err["message"]
            assert "retry-after" not in r.headers and r.headers["x-should-retry"] == "false"
        async with httpx.AsyncClient(trust_env=False) as http:
            ready = await http.get(server.origin + "/ready")
    assert ready.status_code == 503, ready.text
    body = ready.json()
    assert body["ready"] is False and "unreachable" in body["reason"] and label in body["reason"]
    assert body["targets"][0]["unreachable"].startswith("endpoint sim")
    # One line for the endpoint and its cause, however many requests failed on it.
    lines = [r.getMessage() for r in caplog.records if r.name == "capmon.client" and "unreachable" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("endpoint sim (") and label in lines[0]


async def test_the_same_endpoint_back_serves_again_without_a_restart(start_sim: StartSim) -> None:
    port = free_port()
    async with gateway_for(f"http://127.0.0.1:{port}/v1", models=("flagship",)) as (client, _app, server):
        sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        for _ in range(3):  # enough to open its breaker: its probe is what finds it back
            with pytest.raises(openai.APIStatusError) as info:
                await sdk.chat.completions.create(model="auto", messages=HELLO)
            assert info.value.response.json()["error"]["code"] == "upstream_unreachable"
        await asyncio.sleep(3)
        await start_sim(scenario(), port=port)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while True:
            try:
                answer = await sdk.chat.completions.with_raw_response.create(model="auto", messages=HELLO)
                break
            except openai.APIStatusError as e:
                assert e.response.json()["error"]["code"] == "upstream_unreachable"
            assert loop.time() - t0 < 60, "not back within a minute"
            await asyncio.sleep(0.5)
        assert answer.headers["x-capmon-model"] == "flagship"
        snap = client.snapshot()
        assert snap.targets[0].unreachable_reason is None


def test_capmon_serve_says_it_once_on_stderr_however_many_requests_fail(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path / "config.toml", NO_SUCH_HOST, endpoint="openai", keys=[], models=["gpt-4o"])
    proc = serve_process(config, port)
    try:
        assert proc.stdout is not None
        assert "listening on" in proc.stdout.readline()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http:
            answers = [http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO}) for _ in range(6)]
            ready = http.get("/ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert [a.status_code for a in answers] == [502] * 6
    assert all(a.json()["error"]["code"] == "upstream_unreachable" for a in answers)
    assert ready.status_code == 503 and "DNS lookup failed" in ready.json()["reason"]
    lines = [line for line in err.splitlines() if line.strip() and "capmon gateway: stopped" not in line]
    assert len(lines) == 1, err
    assert "endpoint openai (capmon-no-such-host.invalid) is unreachable: DNS lookup failed" in lines[0]
