"""The Gemini API and Vertex AI dialects (capmon/core/providers/gemini_dialect.py,
vertex_dialect.py): their URLs, plain and streamed (``Dialect.stream_urls``, the target's
``url`` and ``head``), Vertex's publishers and hosts, the body Claude takes on Vertex, a
static key's headers, and their endpoint keys in the config."""

from __future__ import annotations

import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.providers import formats, vertex_dialect
from capmon.core.providers.dialect import DIALECTS
from capmon.core.providers.token_param import TokenParam
from capmon.core.routing.attempt import chat_request
from capmon.core.routing.targets import Target, build_targets
from capmon.core.types.config import (
    ClientConfig,
    Config,
    DropRule,
    EndpointApi,
    parse_config,
    resolve_keys,
)
from capmon.core.types.result import Format, Request

pytestmark = pytest.mark.unit

TOKEN = "ya29.a0-static-token-from-gcloud-0123456789"
PROJECT = "my-project-123"


def config(endpoint: str, model: str = "gemini-2.5-flash", keys: str = 'keys = [{ env = "K" }]') -> str:
    return f"""
[simulator]
enabled = false
[[endpoints]]
name = "ep"
{keys}
{endpoint}
[[models]]
name = "m"
api_model = "{model}"
endpoints = ["ep"]
max_tokens = 100
"""


def target(endpoint: str, model: str = "gemini-2.5-flash") -> Target:
    cfg = parse_config(config(endpoint, model), "t.toml")
    _, targets = build_targets(cfg, resolve_keys(cfg, {"K": TOKEN}))
    return targets[0]


def vertex(region: str = "us-east5", extra: str = "") -> str:
    return f'api = "vertex"\nproject = "{PROJECT}"\nregion = "{region}"\n{extra}'


def urls(t: Target, wire: Format) -> tuple[str, str]:
    """Where a plain and a streamed attempt in ``wire`` go, and their heads say the same host."""
    plain, streamed = t.url(wire), t.url(wire, streamed=True)
    assert t.head(wire).headers["host"] == plain.netloc.decode() == streamed.netloc.decode()
    return str(plain), str(streamed)


# ---------------------------------------------------------------- URLs


def test_the_gemini_api_streams_at_its_own_url_on_googles_host_by_default() -> None:
    t = target('api = "gemini"')
    assert t.endpoint.base_url == "https://generativelanguage.googleapis.com"
    assert urls(t, Format.GEMINI) == (
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent",
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
    )
    assert t.head(Format.GEMINI) is t.head(Format.GEMINI) and t.head(Format.GEMINI, True) is not t.head(Format.GEMINI)


def test_a_gemini_base_url_and_a_tuned_model_resource_are_taken_as_written() -> None:
    t = target('api = "gemini"\nbase_url = "http://127.0.0.1:9/"', model="tunedModels/my-tune-7")
    assert urls(t, Format.GEMINI) == (
        "http://127.0.0.1:9/v1beta/tunedModels/my-tune-7:generateContent",
        "http://127.0.0.1:9/v1beta/tunedModels/my-tune-7:streamGenerateContent?alt=sse",
    )


@pytest.mark.parametrize(
    ("region", "host"),
    [
        ("us-east5", "https://us-east5-aiplatform.googleapis.com"),
        ("global", "https://aiplatform.googleapis.com"),
        ("eu", "https://aiplatform.eu.rep.googleapis.com"),
    ],
)
def test_vertex_serves_gemini_and_claude_under_the_regions_host(region: str, host: str) -> None:
    models = f"{host}/v1/projects/{PROJECT}/locations/{region}/publishers"
    gemini = target(vertex(region))
    assert gemini.endpoint.base_url == host
    assert urls(gemini, Format.GEMINI) == (
        f"{models}/google/models/gemini-2.5-flash:generateContent",
        f"{models}/google/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
    )
    claude = target(vertex(region), model="claude-sonnet-4-5@20250929")
    assert urls(claude, Format.MESSAGES) == (
        f"{models}/anthropic/models/claude-sonnet-4-5@20250929:rawPredict",
        f"{models}/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict",
    )
    assert set(claude.urls) == {Format.MESSAGES} and set(gemini.urls) == {Format.GEMINI}


def test_a_vertex_base_url_replaces_the_host_only() -> None:
    t = target(vertex("us-central1", 'base_url = "http://127.0.0.1:9"'))
    assert str(t.url(Format.GEMINI)) == (
        f"http://127.0.0.1:9/v1/projects/{PROJECT}/locations/us-central1/publishers/google/models/"
        "gemini-2.5-flash:generateContent"
    )


def test_the_existing_apis_stream_at_their_plain_url() -> None:
    for endpoint, wire in [
        ('api = "openai"\nbase_url = "https://api.example/v1"', Format.CHAT),
        ('api = "anthropic"\nbase_url = "https://api.example"', Format.MESSAGES),
        ('api = "azure"\nbase_url = "https://res.openai.azure.com"', Format.RESPONSES),
    ]:
        t = target(endpoint)
        assert t.stream_urls == {} and t.url(wire, streamed=True) == t.url(wire)
        assert t.head(wire, streamed=True) is t.head(wire)  # one head for the one URL


def test_an_attempt_says_whether_it_streams() -> None:
    t = target(vertex(), model="claude-haiku-4-5@20251001")
    request = Request.anthropic({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10})
    assert chat_request(t, request, TokenParam.MAX_TOKENS, Config(), True).streamed
    assert not chat_request(t, request, TokenParam.MAX_TOKENS, Config(), False).streamed


# ---------------------------------------------------------------- which wire, which body


def test_vertex_speaks_each_publishers_format_whatever_the_caller_speaks() -> None:
    gemini, claude = DIALECTS[EndpointApi.GEMINI], DIALECTS[EndpointApi.VERTEX]
    for caller in Format:
        assert gemini.wire_of(caller, "gemini-2.5-pro") is Format.GEMINI
        assert claude.wire_of(caller, "gemini-2.5-pro") is Format.GEMINI
        assert claude.wire_of(caller, "claude-opus-4-1@20250805") is Format.MESSAGES
    assert vertex_dialect.publisher("claude-3-5-haiku@20241022") is vertex_dialect.Publisher.ANTHROPIC
    assert vertex_dialect.publisher("gemini-claude-lookalike") is vertex_dialect.Publisher.GOOGLE


@pytest.mark.parametrize("stream", [False, True])
def test_claude_on_vertex_takes_the_messages_body_with_vertexs_version_and_without_its_model(stream: bool) -> None:
    t = target(vertex(), model="claude-sonnet-4-5@20250929")
    request = Request.anthropic(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "temperature": 0.3, "top_k": 4}
    )
    out = chat_request(t, request, TokenParam.MAX_TOKENS, Config(), stream)
    assert out.api is Format.MESSAGES and out.dropped == ()
    expected = {
        "anthropic_version": "vertex-2023-10-16",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 50,
        "temperature": 0.3,  # Vertex's version refuses no sampling field: 2026-10-21's rule is Anthropic's own
        "top_k": 4,
    }
    assert out.body == ({**expected, "stream": True} if stream else expected)
    assert formats.incapable(request, t, ClientConfig(refused_sampling=DropRule.SKIP)) is None


def test_a_chat_request_to_claude_on_vertex_is_translated_then_given_vertexs_rules() -> None:
    t = target(vertex("global"), model="claude-haiku-4-5@20251001")
    out = chat_request(t, Request.of([{"role": "user", "content": "hi"}]), TokenParam.MAX_TOKENS, Config(), False)
    assert out.api is Format.MESSAGES and "model" not in out.body
    assert out.body["anthropic_version"] == "vertex-2023-10-16" and out.body["max_tokens"] == 100


# ---------------------------------------------------------------- keys


def test_a_static_key_is_a_fixed_header_on_both_apis() -> None:
    gemini = target('api = "gemini"')
    heads = dict((k.decode(), v.decode()) for k, v in gemini.http_headers)
    assert heads["x-goog-api-key"] == TOKEN and "authorization" not in heads and gemini.auth.sign is None
    claude = target(vertex(), model="claude-haiku-4-5@20251001")
    heads = dict((k.decode(), v.decode()) for k, v in claude.http_headers)
    assert heads["authorization"] == f"Bearer {TOKEN}" and "anthropic-version" not in heads
    assert claude.auth.sign is None and TOKEN not in repr(claude)


def test_vertex_without_keys_signs_each_request_with_its_credentials() -> None:
    cfg = parse_config(config(vertex(extra='credentials_file = "/nonexistent/sa.json"'), keys="keys = []"), "t.toml")
    _, (t,) = build_targets(cfg, resolve_keys(cfg, {}))
    assert t.auth.sign is not None and not t.auth.headers  # nothing read yet: at the first request


# ---------------------------------------------------------------- the config


def fails(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        parse_config(text, "cfg.toml")
    return e.value


def test_vertex_needs_a_project_and_a_region() -> None:
    e = fails(config('api = "vertex"\nregion = "global"'))
    assert e.key == "endpoints[0].project" and "missing" in str(e) and str(e).startswith("cfg.toml: ")
    e = fails(config(f'api = "vertex"\nproject = "{PROJECT}"'))
    assert e.key == "endpoints[0].region" and '"global"' in e.detail
    assert fails(config(vertex("US East"))).key == "endpoints[0].region"
    assert fails(config(vertex().replace(PROJECT, "My Project/../x"))).key == "endpoints[0].project"


@pytest.mark.parametrize("api", ["openai", "anthropic", "azure", "gemini"])
def test_vertexs_keys_are_refused_on_other_apis(api: str) -> None:
    for setting in (f'project = "{PROJECT}"', 'region = "global"', 'credentials_file = "sa.json"'):
        e = fails(config(f'api = "{api}"\nbase_url = "https://x.example"\n{setting}'))
        assert e.key == f"endpoints[0].{setting.split()[0]}" and 'only for api = "vertex"' in e.detail


def test_base_url_is_required_but_for_googles_apis() -> None:
    for api in ("openai", "anthropic", "azure"):
        e = fails(config(f'api = "{api}"'))
        assert e.key == "endpoints[0].base_url" and "missing" in e.detail
    cfg = parse_config(config('api = "gemini"'), "cfg.toml")
    assert cfg.endpoints[0].base_url == "https://generativelanguage.googleapis.com"
    assert cfg.endpoint("ep") is cfg.endpoints[0]
