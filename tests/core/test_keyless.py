"""An endpoint with ``keys = []`` (a local vLLM or Ollama server that takes no key) needs no
dummy key variable: its one target sends no key header at all."""

from __future__ import annotations

import pytest

from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import NO_KEY, Config
from tests.support.configs import build_config
from tests.support.scripted import Script, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]


def _local(url: str, keys: str = "keys = []") -> Config:
    """llama on a local server (endpoint ``local``), ``keys = []`` or no keys line at all."""
    return build_config(url, endpoint="local", keys=[] if keys else None, models=["llama"], file="local.toml")


@pytest.mark.parametrize("keys", ["keys = []", ""], ids=["empty", "left-out"])
async def test_an_endpoint_without_keys_is_served_and_sends_no_key(keys: str) -> None:
    script = Script()
    async with serve(script) as url:
        cfg = _local(url, keys)
        async with FallbackClient(cfg, environ={}) as client:
            result = await client.chat("hi")
            (target,) = client.targets
    assert result.model == "llama" and target.id == f"llama@local/{NO_KEY}"
    (seen,) = script.seen
    assert seen.key == ""  # no Authorization header was sent
    assert all(name != b"authorization" for name, _ in target.http_headers)
