"""Fixtures for the fleet's tests, which run against a real redis-server, never a mock.

* ``redis_url``: the project's Redis (``CAPMON_TEST_REDIS_URL``, default
  ``redis://127.0.0.1:6379/15``). Unreachable: the test is skipped and says why;
  ``CAPMON_REQUIRE_REDIS=1`` (set by .ci/run) turns that skip into a failure.
* ``namespace``: a unique namespace per test, deleted afterwards.
* ``redis_server``: a redis-server of the test's own on a free loopback port, which the
  test may stop, kill and start again (empty): for the fault tests.

These tests run in real time (shared time is Redis's clock, which no loop can
fast-forward), with intervals and TTLs of tenths of a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.support.scripted import free_port

DEFAULT_URL = "redis://127.0.0.1:6379/15"


def _unavailable(why: str) -> None:
    if os.environ.get("CAPMON_REQUIRE_REDIS") == "1":
        pytest.fail(f"{why} (CAPMON_REQUIRE_REDIS=1)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = os.environ.get("CAPMON_TEST_REDIS_URL", DEFAULT_URL)
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        client.ping()
    except (redis.RedisError, OSError) as e:
        _unavailable(f"no Redis at {url} for the fleet tests ({e}); set CAPMON_TEST_REDIS_URL or start redis-server")
    finally:
        client.close()
    return url


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    ns = f"capmon-test-{uuid.uuid4().hex[:12]}"
    yield ns
    client = redis.Redis.from_url(redis_url, socket_timeout=2.0)
    try:
        keys = list(client.scan_iter(match=f"{ns}:*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


class RedisServer:
    """A redis-server of one test's own, on 127.0.0.1 only, no persistence."""

    def __init__(self, binary: str, port: int) -> None:
        self.binary = binary
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (again): a restarted server is empty."""
        assert self.proc is None or self.proc.poll() is not None
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                client = redis.Redis(port=self.port, socket_timeout=0.2, socket_connect_timeout=0.2)
                client.ping()
                client.close()
                return
            except (redis.RedisError, OSError):
                time.sleep(0.01)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2.0, decode_responses=True)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        _unavailable("redis-server is not installed: the fault tests start their own (apt-get install redis-server)")
    assert binary is not None
    server = RedisServer(binary, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
