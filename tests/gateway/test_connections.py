"""Connection hygiene over raw sockets: a header timeout (nothing sent, or headers one
byte at a time), an idle keep-alive timeout, a cap on open connections with a clean
refusal and a quiet log, and malformed HTTP answered in the API's JSON error shape.
On main none of these connections was ever closed, and malformed HTTP got plain text.
Each for both HTTP parsers the gateway serves with (``[gateway] http``)."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.gateway.helpers import running
from tests.gateway.sockets import Received, answers, connect, receive, request
from tests.gateway.test_serve import _shipped_config
from tests.support.scripted import free_port

pytestmark = pytest.mark.looptime

TIMEOUTS = "header_timeout = 0.5\nkeep_alive_timeout = 0.5"


def assert_api_error(got: Received, status: int, code: str) -> None:
    assert got.status == status, got.data[:300]
    assert got.headers["content-type"] == "application/json" and got.headers["connection"] == "close"
    error = got.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    assert got.closed


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(parser: str) -> None:
    async with running(gateway=TIMEOUTS + "\n" + parser) as gw:
        sock = await connect(gw.server.port)
        start = asyncio.get_running_loop().time()
        got = await receive(sock, 30.0)  # on main: still open after 30 s
        waited = asyncio.get_running_loop().time() - start
        sock.close()
    assert got.closed and got.data == b""  # nothing to answer: closed quietly
    assert 0.5 <= waited < 5.0


@pytest.mark.looptime(False)  # real time: the client's bytes and the server's timer race for real
async def test_headers_sent_one_byte_at_a_time_are_cut_at_the_header_timeout() -> None:
    # The default parser only: real time, and the parsers share the timer (h11's part is
    # the "sends nothing" test's).
    async with running(gateway="header_timeout = 0.5") as gw:
        loop = asyncio.get_running_loop()
        sock = await connect(gw.server.port)
        head = request("GET", "/health", x_padding="a" * 60)  # 100 bytes: 10 s at one each 0.1 s
        sent = 0
        try:
            for byte in head:
                await loop.sock_sendall(sock, bytes([byte]))
                sent += 1
                await asyncio.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = await receive(sock, 5.0)
        sock.close()
    assert 2 <= sent <= 60  # cut about 1.5 s in (0.5 s, then 1 s for the client to read the 408)
    assert_api_error(got, 408, "request_timeout")


async def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(parser: str) -> None:
    async with running(gateway="keep_alive_timeout = 0.5\n" + parser) as gw:
        loop = asyncio.get_running_loop()
        sock = await connect(gw.server.port)
        await loop.sock_sendall(sock, request("GET", "/health"))
        got = await receive(sock, 20.0)  # on main: open for the 30 s it kept idle connections
        sock.close()
    assert got.status == 200 and got.closed


async def test_past_the_connection_cap_a_new_connection_gets_a_json_503_and_the_log_one_line_a_second(
    caplog: pytest.LogCaptureFixture, parser: str
) -> None:
    caplog.set_level(logging.INFO, "capmon.gateway")
    async with running(gateway="max_connections = 3\nheader_timeout = 60\n" + parser) as gw:
        loop = asyncio.get_running_loop()
        held = [await connect(gw.server.port) for _ in range(3)]
        await asyncio.sleep(0.05)
        refused = []
        for _ in range(20):
            sock = await connect(gw.server.port)
            await loop.sock_sendall(sock, request("GET", "/health"))
            refused.append(await receive(sock, 5.0))
            sock.close()
        await asyncio.sleep(1.5)  # the throttle's count comes out once the second is over
        held.pop().close()
        await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=gw.origin, trust_env=False) as http:
            ok = await http.get("/health")  # a freed place serves at once
        for sock in held:
            sock.close()
    for got in refused:
        assert_api_error(got, 503, "too_many_connections")
        assert got.headers["retry-after"] == "1"
    lines = [r.getMessage() for r in caplog.records if "gateway.max_connections" in r.getMessage()]
    assert len(lines) == 2, lines  # 20 refusals in well under a second: the first, then a count
    assert "19 more like it" in lines[1]
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (request("POST", "/v1/chat/completions", content_length="-1"), 400),
        (request("GET", "/health", x_big="a" * 1_000_000), 431),  # a 1 MB header line
        (b"GET /health HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n", 400),  # no colon
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64, 400),  # TLS spoken to plain HTTP
    ],
    ids=["negative-content-length", "1mb-header-line", "no-colon", "tls-hello"],
)
async def test_malformed_http_gets_the_apis_json_error(raw: bytes, status: int, parser: str) -> None:
    async with running(gateway=parser) as gw:
        loop = asyncio.get_running_loop()
        sock = await connect(gw.server.port)
        try:
            await loop.sock_sendall(sock, raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway answered and stopped reading before the whole line was sent
        got = await receive(sock, 5.0)
        sock.close()
    assert_api_error(got, status, "malformed_http")
    assert got.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.looptime(False)
def test_out_of_descriptors_the_accept_loop_logs_one_line_a_second(tmp_path: Path) -> None:
    # capmon serve with 60 descriptors (soft and hard, so it cannot raise them) and 150
    # connections opened at once: on main asyncio logged 35,000 tracebacks in 3 s.
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPMON_")}
    limit = 60

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    log = tmp_path / "stderr.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "capmon.cli", "serve", "--config", str(_shipped_config(tmp_path))]
        + ["--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),  # a file: on main the flood of tracebacks filled a pipe and hung the gateway
        env=env,
        text=True,
        preexec_fn=few_descriptors,
    )
    try:
        assert proc.stdout is not None and "listening on" in proc.stdout.readline()
        flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(150)]
        time.sleep(1.5)
        for s in flood:
            s.close()
        ok = None
        for _ in range(50):  # served again once the flood is gone
            try:
                ok = httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False, timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    err = log.read_text()
    lines = [line for line in err.splitlines() if "cannot accept a connection" in line]
    assert "Traceback" not in err, err[:2000]
    assert 1 <= len(lines) <= 5, err[:2000]  # about 1.5 s of it: one line a second, with a count
    assert "Too many open files" in lines[0] and "more like it" in err
    assert ok is not None and ok.status_code == 200


@pytest.mark.parametrize("where", ["line", "headers"])
async def test_a_head_over_the_limit_in_one_read_is_a_431_with_httptools(where: str) -> None:
    # 20 KiB of head arriving whole: llhttp has no limit of its own, the gateway counts it.
    # (h11 limits only a head still incomplete, so it reads this one: as it always has.)
    raw = (
        request("GET", "/health?" + "a" * 20_000)
        if where == "line"
        else request("GET", "/health", **{f"x_h{i}": "b" * 1000 for i in range(20)})
    )
    async with running(gateway='http = "httptools"') as gw:
        loop = asyncio.get_running_loop()
        sock = await connect(gw.server.port)
        try:
            await loop.sock_sendall(sock, raw)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = await receive(sock, 5.0)
        sock.close()
    assert_api_error(got, 431, "malformed_http")


async def test_a_kept_alive_connection_serves_requests_one_after_another(parser: str) -> None:
    # The head counter starts again at every request: many small requests on one connection pass.
    async with running(gateway=parser) as gw:
        async with httpx.AsyncClient(base_url=gw.origin, trust_env=False) as client:
            answers = [await client.get("/health", headers={"x-padding": "p" * 4000}) for _ in range(10)]
    assert [a.status_code for a in answers] == [200] * 10


async def test_a_head_request_is_answered(parser: str) -> None:
    # The answer to HEAD is a head alone; httptools' protocol held it back waiting for the
    # first part of a body that never comes, and the client waited for ever.
    async with running(gateway=parser) as gw:
        sock = await connect(gw.server.port)
        await asyncio.get_running_loop().sock_sendall(sock, request("HEAD", "/health") + request("GET", "/health"))
        got = await receive(sock, 5.0)
        sock.close()
    head, _, rest = got.data.partition(b"\r\n\r\n")
    assert Received(head, False).status == 200 and Received(head, False).headers["content-length"] == "15"
    assert [Received(a, False).json() for a in answers(rest)] == [{"status": "ok"}]
