"""``capmon serve --workers 2``: two real processes on one port (SO_REUSEPORT) acting as
one client through a real Redis. Both serve (every reply names its worker), a trip
through one is seen through the other, ``/metrics`` from either adds up both, SIGTERM
stops both; and more than one worker without ``[shared]`` Redis is one line, exit 2."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from capmon.cli import main
from tests.fleet.conftest import namespace, redis_url  # noqa: F401  (fixtures: a real Redis, a namespace of our own)
from tests.gateway.test_serve import _shipped_config

ADMIN = "sk-workers-test-admin-0123456789"
BANNER = re.compile(r"listening on http://127\.0\.0\.1:(\d+)/v1 .*; 2 workers, pids (\d+), (\d+);")
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 8}


def _config(tmp_path: Path, url: str, ns: str) -> Path:
    path = _shipped_config(tmp_path)
    text = path.read_text()
    assert "[shared]" not in text and "[gateway]" not in text
    path.write_text(
        text + f'\n[shared]\nbackend = "redis"\nurl = "{url}"\nnamespace = "{ns}"\nreconcile = 0.2\n'
        '\n[gateway]\nadmin_key_env = "CAPMON_WORKERS_ADMIN"\n'
    )
    return path


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CAPMON_")}, "CAPMON_WORKERS_ADMIN": ADMIN}


def _fresh(origin: str, method: str, path: str, **kw: object) -> httpx.Response:
    """One request on a connection of its own: the kernel picks the worker per connection."""
    with httpx.Client(base_url=origin, trust_env=False, timeout=10) as http:
        return http.request(method, path, **kw)  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_workers_serve_one_port_as_one_client_and_stop_together(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    namespace: str,  # noqa: F811
) -> None:
    config = _config(tmp_path, redis_url, namespace)
    argv = [sys.executable, "-m", "capmon.cli", "serve", "--config", str(config), "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*argv, "--workers", "2"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        found = BANNER.search(banner)
        if not found:  # say why: the supervisor's and the workers' log
            proc.terminate()
            _, err = proc.communicate(timeout=20)
            raise AssertionError(f"no banner: {banner!r}, exit {proc.returncode}, stderr: {err[-3000:]}")
        origin = f"http://127.0.0.1:{found.group(1)}"
        pids = [int(found.group(2)), int(found.group(3))]

        # Both serve: each connection is one worker's, and the reply says whose.
        served: dict[str, int] = {}
        chats = 0
        while len(served) < 2 and chats < 60:
            r = _fresh(origin, "POST", "/v1/chat/completions", json=CHAT)
            assert r.status_code == 200, r.text
            chats += 1
            served[r.headers["x-capmon-worker"]] = served.get(r.headers["x-capmon-worker"], 0) + 1
        assert set(served) == {"1", "2"}, served

        # A trip through one worker is seen through the other (the shared state, pushed by pub/sub).
        admin = {"authorization": f"Bearer {ADMIN}"}
        tripped = _fresh(origin, "POST", "/capmon/trip", json={"target": "medium"}, headers=admin)
        assert tripped.status_code == 200, tripped.text
        by = tripped.headers["x-capmon-worker"]
        seen = None
        deadline = time.monotonic() + 5.0
        while seen is None and time.monotonic() < deadline:
            r = _fresh(origin, "GET", "/capmon/snapshot")
            states = {t["state"] for t in r.json()["targets"] if t["model"] == "medium"}
            if r.headers["x-capmon-worker"] != by and states == {"forced-open"}:
                seen = r.headers["x-capmon-worker"]
        assert seen is not None and seen != by, f"worker {by} tripped medium; the other never showed it"

        # /metrics from either worker counts both workers' answers.
        text = _fresh(origin, "GET", "/metrics").text
        count = re.search(r'capmon_gateway_responses_total\{api="chat",status="200"\} (\S+)', text)
        assert count is not None and float(count.group(1)) == chats, text[:2000]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert err.count("stopped") == 2 and "Traceback" not in err, err
    assert not any(_alive(pid) for pid in pids)


def test_more_than_one_worker_without_shared_redis_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _shipped_config(tmp_path)
    code = main(["serve", "--config", str(config), "--listen", "127.0.0.1:0", "--workers", "2"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(config) in lines[0] and "shared.backend" in lines[0], err
    assert 'backend = "redis"' in lines[0]
