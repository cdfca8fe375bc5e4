"""A client that stops reading a stream gives its slot back after gateway.write_timeout:
its stream is cancelled, upstream included, its connection closed, and the others are
served. (On main, four such clients held the four slots until they closed.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

import pytest

from tests.gateway.helpers import HELLO, Running, running, scenario, spec, until
from tests.gateway.sockets import connect, receive, request

pytestmark = pytest.mark.looptime

SLOTS = 4  # the flagship's concurrency limit: every slot taken by a client that never reads
LONG = 20_000  # tokens in the answer: far more bytes than the socket buffers on the way hold


def long_streams(
    gateway: str, per_token: float = 0.0005, tokens: int = LONG
) -> contextlib.AbstractAsyncContextManager[Running]:
    flagship = spec("flagship", slots=64, base_latency=0.05, answer_tokens=tokens, per_token=per_token)
    limiter = f"[limiter]\ninitial = {SLOTS}\nmin = 1\nmax = {SLOTS}"
    return running(scenario(flagship), models=("flagship",), extra=limiter, gateway=gateway, max_tokens=tokens)


def in_flight(gw: Running) -> int:
    return gw.client.snapshot().targets[0].in_flight


async def sim_free(gw: Running) -> bool:
    state: Any = await gw.sim_model("sim-flagship")
    return int(state["in_flight"]) == 0


async def test_clients_that_never_read_a_stream_give_their_slots_back_after_the_write_timeout() -> None:
    async with long_streams("write_timeout = 0.5") as gw:
        body = json.dumps({"model": "flagship", "messages": HELLO, "stream": True}).encode()
        stalled: list[socket.socket] = []
        for _ in range(SLOTS):
            sock = await connect(gw.server.port, rcvbuf=4096)
            await asyncio.get_running_loop().sock_sendall(
                sock, request("POST", "/v1/chat/completions", body, content_type="application/json")
            )
            stalled.append(sock)  # and never read
        await until(lambda: in_flight(gw) == SLOTS, "the stalled clients took every slot")
        held = gw.client.snapshot().targets[0].in_flight
        # Past the write timeout each stalled stream is cancelled, and its upstream too.
        await until(lambda: in_flight(gw) == 0, "the stalled streams gave their slots back", 20.0)
        await until(lambda: sim_free(gw), "the upstream streams were closed", 5.0)
        ends = [await receive(sock, 5.0) for sock in stalled]
        async with gw.http() as http:
            r = await http.post(
                "/v1/chat/completions",
                json={"model": "flagship", "messages": HELLO, "max_tokens": 5},
                headers={"x-capmon-deadline": "5"},
            )
        for sock in stalled:
            sock.close()
        snap = gw.client.snapshot()
        disconnects = gw.app.state.gateway.metrics.registry.get_sample_value(
            "capmon_gateway_disconnects_total", {"api": "chat"}
        )
    assert held == SLOTS
    assert all(end.closed for end in ends), [(len(e.data), e.closed, e.data[-200:]) for e in ends]
    assert r.status_code == 200 and r.headers["x-capmon-model"] == "flagship"
    assert snap.targets[0].in_flight == 0 and snap.failed == 0  # cancelled, not failed
    assert disconnects == SLOTS


@pytest.mark.looptime(False)  # real time: the client's reading and the server's timer race for real
async def test_a_client_that_reads_slowly_but_steadily_is_not_cut() -> None:
    # The timeout is for a client that takes nothing: one that takes a little now and then
    # keeps its stream, though the server's buffers stay full (the kernel's send queue
    # shows its progress) and it has to wait for the client for far longer than the timeout.
    # 8,000 tokens: about 530 kB, more than the buffers on the way hold (about 330 kB)
    async with long_streams("write_timeout = 0.5", per_token=0.0, tokens=8000) as gw:
        body = json.dumps({"model": "flagship", "messages": HELLO, "stream": True}).encode()
        sock = await connect(gw.server.port, rcvbuf=4096)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, request("POST", "/v1/chat/completions", body, content_type="application/json"))
        data = b""
        while not data.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
            await asyncio.sleep(0.02)  # well inside the write timeout
            try:
                async with asyncio.timeout(5):
                    got = await loop.sock_recv(sock, 65536)
            except TimeoutError:
                break
            if not got:
                break
            data += got
        sock.close()
    assert data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and data.count(b"data: ") > 500
