"""Dialects (capmon/core/providers/dialect.py): the registry, and the per-request auth hook
(``Auth.sign``) called on every request an attempt builds, a user's, a retry's, a
fallback's, the prober's and a stream's, with the final bytes of the body it sends, over
real HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from capmon.core.providers import openai_dialect
from capmon.core.providers.dialect import DIALECTS, Auth, Headers, dialect_of
from capmon.core.providers.sse import SSEParser
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import ENDPOINT_SETTINGS, DropRule, EndpointApi, EndpointConfig, ModelConfig
from capmon.core.types.result import Format, Request
from capmon.sim.scenario import Scenario
from tests.support.configs import build_config, flagship_and_medium, sim_models
from tests.support.scripted import OVERLOADED, Script, ok, serve
from tests.support.simulated import StartSim, sim_model

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

KEY = "sk-signing"
SIGNATURE = "x-capmon-test-signature"


def signature(body: bytes) -> str:
    return hmac.new(KEY.encode(), body, hashlib.sha256).hexdigest()


class Signing:
    """The OpenAI dialect whose key signs each request (an HMAC of its body under the
    key, as AWS SigV4 signs a body's hash), recording each body it signed."""

    def __init__(self) -> None:
        self.signed: list[bytes] = []

    def wire_of(self, caller: Format, model: str) -> Format:
        return openai_dialect.wire_of(caller, model)

    def urls(self, endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
        return openai_dialect.urls(endpoint, model)

    def stream_urls(self, endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
        return {}

    def unserved(self, endpoint: EndpointConfig, wire: Format) -> str | None:
        return None

    def auth(self, endpoint: EndpointConfig, secret: str) -> Auth:
        async def sign(request: httpx.Request) -> None:
            await asyncio.sleep(0)  # a hook may await (a token refresh would)
            self.signed.append(request.content)
            request.headers[SIGNATURE] = hmac.new(secret.encode(), request.content, hashlib.sha256).hexdigest()

        return Auth({"authorization": f"Bearer {secret}"}, sign)

    def caller_headers(self, headers: Headers, request: Request) -> Headers | None:
        return None

    def framing(self) -> SSEParser:
        return openai_dialect.framing()

    def has_body_rules(self, endpoint: EndpointConfig) -> bool:
        return False

    def body_rules(
        self, body: dict[str, Any], endpoint: EndpointConfig, wire: Format, refused_sampling: DropRule
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        return body, ()


@pytest.fixture
def signing(monkeypatch: pytest.MonkeyPatch) -> Iterator[Signing]:
    dialect = Signing()
    monkeypatch.setitem(DIALECTS, EndpointApi.OPENAI, dialect)  # type: ignore[arg-type]
    yield dialect


async def test_every_attempt_and_probe_is_signed_over_the_body_it_sends(signing: Signing) -> None:
    script = Script()
    script.set("a", lambda n, body: OVERLOADED if n == 1 else ok("a"))  # a retry, then served
    script.always("b", OVERLOADED)  # b first: fails, falls back to a
    models = {"b": {"max_tokens": 64}, "a": {"max_tokens": 64}}
    async with serve(script) as url:
        cfg = build_config(url, keys=[("SIGNING_KEY", "s")], models=models)
        async with FallbackClient(cfg, environ={"SIGNING_KEY": KEY}) as client:
            result = await client.chat("hi")
            probe = await client.probe(next(t.id for t in client.targets if t.model.name == "a"))
            heads = [t.head(Format.CHAT).headers for t in client.targets]
    assert result.model == "a" and probe.ok
    models = [s.model for s in script.seen]  # b refused, a refused, a served, a probed (b may be tried again)
    assert models[0] == "b" and models.count("a") == 3 and models[-2:] == ["a", "a"]
    # Every request the server saw was signed, by the hook, over the very bytes it received.
    assert signing.signed == [s.raw for s in script.seen]
    for seen in script.seen:
        assert seen.headers[SIGNATURE] == signature(seen.raw) and seen.key == KEY
    assert all(SIGNATURE not in head for head in heads)  # signed per request: the ready block untouched
    assert any("messages" in s.body and s.body["messages"][0]["content"] == "ping" for s in script.seen)  # the probe


async def test_a_stream_is_signed_over_its_streaming_body(signing: Signing, start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(sim_model("flagship", 4), sim_model("medium", 4))))
    async with FallbackClient(flagship_and_medium(sim.base_url), environ={"KEY": "sk-capmon-sim-demo"}) as client:
        chunks = [c async for c in client.stream_chunks("hi")]
    assert chunks and len(signing.signed) == 1
    assert b'"stream": true' in signing.signed[0] and b'"model": "sim-flagship"' in signing.signed[0]


def test_a_static_key_has_no_per_request_hook() -> None:
    cfg = build_config("http://127.0.0.1:1/v1", keys=[("K", "k")], models=sim_models(["a"]))
    for api in EndpointApi:
        auth = DIALECTS[api].auth(cfg.endpoints[0], "secret")
        assert auth.sign is None and "secret" in " ".join(auth.headers.values())
        assert DIALECTS[api].auth(cfg.endpoints[0], "").headers.keys() <= {"anthropic-version"}


def test_every_endpoint_api_has_a_dialect_and_its_own_settings_are_endpoint_keys() -> None:
    assert set(DIALECTS) == set(EndpointApi)
    cfg = build_config("http://127.0.0.1:1/v1", keys=[("K", "k")], models=sim_models(["a"]))
    assert dialect_of(cfg.endpoints[0]) is DIALECTS[EndpointApi.OPENAI]
    fields = set(EndpointConfig.__dataclass_fields__)
    assert {name for names in ENDPOINT_SETTINGS.values() for name in names} <= fields
    assert set(ENDPOINT_SETTINGS) <= set(EndpointApi)
