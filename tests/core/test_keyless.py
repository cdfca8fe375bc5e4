"""An endpoint with ``keys = []`` (a local vLLM or Ollama server that takes no key) needs no
dummy key variable: its one target sends no key header at all."""

from __future__ import annotations

import pytest

from capmon.core.config import NO_KEY, parse_config
from capmon.core.router import FallbackClient
from tests.support.scripted import Script, serve

pytestmark = pytest.mark.looptime


def _local(url: str, keys: str = "keys = []") -> str:
    return f"""
[simulator]
enabled = false

[[endpoints]]
name = "local"
base_url = "{url}"
{keys}

[[models]]
name = "llama"
endpoints = ["local"]
"""


@pytest.mark.parametrize("keys", ["keys = []", ""], ids=["empty", "left-out"])
async def test_an_endpoint_without_keys_is_served_and_sends_no_key(keys: str) -> None:
    script = Script()
    async with serve(script) as url:
        cfg = parse_config(_local(url, keys), "local.toml")
        async with FallbackClient(cfg, environ={}) as client:
            result = await client.chat("hi")
            (target,) = client.targets
    assert result.model == "llama" and target.id == f"llama@local/{NO_KEY}"
    (seen,) = script.seen
    assert seen.key == ""  # no Authorization header was sent
    assert all(name != b"authorization" for name, _ in target.http_headers)
