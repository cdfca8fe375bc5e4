"""The previous major of the anthropic SDK (1.x, which sends ``anthropic-version: 2023-06-01``
and ``x-api-key``) against capmon serve: installed once with pip into a cache under the
venv (``--target``, no dependencies: it runs on the venv's httpx and pydantic), run in a
subprocess against a gateway in this test's loop (real time: a subprocess does not run on
looptime's clock). Skipped, saying why, only when pip cannot fetch it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway.helpers import running, scenario, spec

V1 = "1.17.0"
CLIENT = "sk-gw-client-sdk1-8e7f6a5b"


@pytest.fixture(scope="session")
def sdk_v1() -> Path:
    target = Path(sys.prefix) / ".cache" / f"anthropic-{V1}"
    if not (target / "anthropic" / "__init__.py").exists():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(target),
                f"anthropic=={V1}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            pytest.skip(f"pip could not install anthropic=={V1}: {done.stderr.strip()[-300:]}")
    return target


async def test_the_anthropic_sdk_1x_against_the_gateway(sdk_v1: Path) -> None:
    scn = scenario(spec("claude", api="anthropic", base_latency=0.05), spec("flagship", base_latency=0.05))
    keys = 'keys = [{ env = "GW_CLIENT", alias = "team" }]'
    kw = {"models": ("claude", "flagship"), "anthropic": ("claude",), "gateway": keys, "environ": {"GW_CLIENT": CLIENT}}
    async with running(scn, **kw) as gw:  # type: ignore[arg-type]
        script = Path(__file__).with_name("anthropic_v1_client.py")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(sdk_v1), os.environ.get("PYTHONPATH", "")])}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), gw.origin, CLIENT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-2000:]
    seen = json.loads(out)
    assert seen["version"] == V1
    assert seen["sent"] == {"anthropic-version": "2023-06-01", "x-api-key": CLIENT, "authorization": None}
    assert seen["served"] == "claude"
    assert (
        seen["plain"]["stop"] == "end_turn"
        and seen["plain"]["usage"] == 12
        and len(seen["plain"]["text"].split()) == 12
    )
    assert seen["stream"]["stop"] == "max_tokens" and len(seen["stream"]["text"].split()) == 5
    assert (
        seen["tool"]["input"]["city"]
        and seen["tool"]["stop"] == ["tool_use"]
        and seen["tool"]["last"] == "message_stop"
    )
    assert seen["count"] > 0
    assert seen["errors"] == {"unknown": "NotFoundError", "bad": "BadRequestError", "auth": "AuthenticationError"}
