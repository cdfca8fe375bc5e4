"""The simulator over real loopback sockets with uvicorn: fast start, real HTTP, reuse of
one already listening, and clear errors when the port is taken."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from capmon.core.base.exceptions import SimulatorError
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import ensure_simulator, parse_listen, probe, running_simulator, start_simulator

AUTH = {"Authorization": f"Bearer {SIMULATOR_DEMO_KEY}"}
FAST = Scenario(
    name="fast",
    models=(ModelSpec(name="sim-small", slots=2, base_latency=0.01, per_token=0.0, noise=0.0, answer_tokens=5),),
)
CHAT = {"model": "sim-small", "messages": [{"role": "user", "content": "hi"}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_answers_once_started() -> None:
    t0 = time.perf_counter()
    async with running_simulator("demo") as sim:  # the bundled demo, as the dashboard starts it
        async with httpx.AsyncClient(trust_env=False) as c:
            r = await c.get(f"{sim.base_url}/models", headers=AUTH)
        took = time.perf_counter() - t0
        assert r.status_code == 200
        assert [m["id"] for m in r.json()["data"]] == ["sim-flagship", "sim-medium", "sim-small"]
        assert took < 30.0, f"first answer after {took:.2f}s"  # it starts; how fast is no test on a shared machine
        assert sim.port > 0 and sim.base_url == f"http://127.0.0.1:{sim.port}/v1"
        assert sim.admin_url == f"http://127.0.0.1:{sim.port}/admin"
    # after the block the port is free again
    with socket.socket() as s:
        s.bind(("127.0.0.1", sim.port))


async def test_chat_and_admin_over_loopback() -> None:
    async with running_simulator(FAST) as sim, httpx.AsyncClient(trust_env=False, timeout=5) as c:
        r = await c.post(f"{sim.base_url}/chat/completions", json=CHAT, headers=AUTH)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        async with c.stream(
            "POST", f"{sim.base_url}/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as s:
            lines = [line async for line in s.aiter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        await c.post(f"{sim.admin_url}/models/sim-small", json={"slots": 0})
        r = await c.post(f"{sim.base_url}/chat/completions", json=CHAT, headers=AUTH)
        assert r.status_code == 503
        stats = (await c.get(f"{sim.admin_url}/stats")).json()
        assert stats["totals"]["accepted"] == 2 and stats["totals"]["rejected"]["capacity"] == 1


async def test_reset_fault_drops_a_real_connection() -> None:
    async with running_simulator(FAST) as sim, httpx.AsyncClient(trust_env=False, timeout=5) as c:
        await c.post(f"{sim.admin_url}/faults", json={"mode": "reset", "count": 1})
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post(f"{sim.base_url}/chat/completions", json=CHAT, headers=AUTH)
        r = await c.post(f"{sim.base_url}/chat/completions", json=CHAT, headers=AUTH)
        assert r.status_code == 200


async def test_many_concurrent_requests_fill_the_slots() -> None:
    slow = Scenario(models=(ModelSpec(name="sim-small", slots=3, base_latency=0.2, per_token=0.0, noise=0.0),))
    async with running_simulator(slow) as sim, httpx.AsyncClient(trust_env=False, timeout=5) as c:
        rs = await asyncio.gather(
            *(c.post(f"{sim.base_url}/chat/completions", json=CHAT, headers=AUTH) for _ in range(8))
        )
        assert sorted(r.status_code for r in rs) == [200] * 3 + [503] * 5


async def test_ensure_simulator_starts_then_reuses() -> None:
    listen = f"127.0.0.1:{free_port()}"
    handle = await ensure_simulator(listen, FAST)
    assert handle is not None
    try:
        assert handle.listen == listen
        assert await ensure_simulator(listen, FAST) is None  # one is already listening there
    finally:
        await handle.stop()
    assert await probe(*parse_listen(listen)) is None


async def test_port_taken_by_something_else() -> None:
    async def not_a_sim(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(not_a_sim, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(SimulatorError, match="not a capmon simulator"):
            await ensure_simulator(f"127.0.0.1:{port}", FAST)
        with pytest.raises(SimulatorError, match="cannot listen"):
            await start_simulator(FAST, port=port)
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("listen", ["8089", "localhost:", "host:99999", ":80"])
def test_bad_listen(listen: str) -> None:
    with pytest.raises(SimulatorError, match="HOST:PORT"):
        parse_listen(listen)
