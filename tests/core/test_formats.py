"""Each endpoint's API: the URL, the key header, the body per (caller format, target API,
version), the refusals that skip a target as incapable, the sampling rule, and the config
keys through the one schema. Pure: no I/O."""

from __future__ import annotations

import dataclasses
import json
import logging
import tomllib

import httpx
import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.base.secrets import redact
from capmon.core.providers import formats
from capmon.core.providers.token_param import TokenParam
from capmon.core.routing.attempt import chat_request
from capmon.core.routing.targets import Target, build_targets
from capmon.core.routing.transport_aiohttp import _scrub
from capmon.core.types.config import (
    AnthropicVersion,
    ClientConfig,
    Config,
    DropRule,
    EndpointApi,
    parse_config,
    resolve_keys,
)
from capmon.core.types.result import Format, Request
from tests.support.configs import config_toml

pytestmark = pytest.mark.unit

KEY = "azure0123456789abcdef0123456789ab"  # Azure keys are 32 hex-ish characters: no pattern finds them


def config(api: str = "openai", extra: str = "", client: str = "", base: str = "https://example.test") -> str:
    """One endpoint of ``api`` with ``extra`` (TOML) among its keys, one model on it (deploy-4o)."""
    return config_toml(
        base,
        endpoints={"ep": {"api": api, **tomllib.loads(extra)}},
        keys=[("K", None)],
        models={"m": {"api_model": "deploy-4o", "max_tokens": 100}},
        client=tomllib.loads(client),
    )


def target(api: str = "openai", extra: str = "", client: str = "", base: str = "https://example.test") -> Target:
    cfg = parse_config(config(api, extra, client, base), "t.toml")
    _, targets = build_targets(cfg, resolve_keys(cfg, {"K": KEY}))
    return targets[0]


def headers(t: Target) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in t.http_headers}


SKIP_SAMPLING = ClientConfig(refused_sampling=DropRule.SKIP)


def body(t: Target, request: Request, *, stream: bool = False, rule: DropRule = DropRule.DROP) -> dict:
    """What one attempt sends (attempt.chat_request: the cap, the rule, the translation)."""
    cfg = dataclasses.replace(Config(), client=ClientConfig(refused_sampling=rule))
    out = chat_request(t, request, TokenParam.MAX_TOKENS, cfg, stream)
    return {"wire": out.api, "dropped": out.dropped, **out.body}


# ---------------------------------------------------------------- URLs and headers


@pytest.mark.parametrize(
    ("api", "extra", "base", "expected"),
    [
        ("openai", "", "https://api.openai.com/v1", {Format.CHAT: "https://api.openai.com/v1/chat/completions"}),
        ("anthropic", "", "https://api.anthropic.com", {Format.MESSAGES: "https://api.anthropic.com/v1/messages"}),
        (
            "azure",
            'api_version = "2024-10-21"',
            "https://res.openai.azure.com/",
            {
                Format.CHAT: "https://res.openai.azure.com/openai/deployments/deploy-4o/chat/completions"
                "?api-version=2024-10-21"
            },
        ),
        (
            "azure",
            "",
            "https://res.openai.azure.com",
            {Format.CHAT: "https://res.openai.azure.com/openai/v1/chat/completions"},
        ),
        (
            "azure",
            'api_version = "v1"',
            "https://res.openai.azure.com",
            {Format.RESPONSES: "https://res.openai.azure.com/openai/v1/responses"},
        ),
    ],
)
def test_each_api_has_its_own_url(api: str, extra: str, base: str, expected: dict) -> None:
    t = target(api, extra, base=base)
    for wire, url in expected.items():
        assert str(t.urls[wire]) == url


@pytest.mark.parametrize(
    ("api", "extra", "expected", "absent"),
    [
        ("openai", "", {"authorization": f"Bearer {KEY}"}, ("x-api-key", "api-key")),
        (
            "anthropic",
            "",
            {"x-api-key": KEY, "anthropic-version": "2026-10-21"},
            ("authorization", "api-key"),
        ),
        (
            "anthropic",
            'anthropic_version = "2023-06-01"\nheaders = { anthropic-beta = "tools-2024" }',
            {"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024"},
            ("authorization",),
        ),
        ("azure", 'api_version = "2024-10-21"', {"api-key": KEY}, ("authorization", "x-api-key")),
        ("azure", "", {"api-key": KEY}, ("authorization",)),
    ],
)
def test_each_api_sends_the_key_in_its_own_header(api: str, extra: str, expected: dict, absent: tuple) -> None:
    h = headers(target(api, extra))
    assert {k: h.get(k) for k in expected} == expected
    assert not any(name in h for name in absent)


def test_the_config_refuses_a_wrong_api_version_or_key_naming_file_and_key() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(config("anthropics"), "my.toml")
    assert "my.toml" in str(e.value) and "endpoints[0].api" in str(e.value) and "'anthropic'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config(config("anthropic", 'anthropic_version = "2024-01-01"'), "my.toml")
    assert "endpoints[0].anthropic_version" in str(e.value) and "'2023-06-01'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config(config("openai", 'api_version = "2024-10-21"'), "my.toml")
    assert "endpoints[0].api_version" in str(e.value) and "azure" in str(e.value)
    with pytest.raises(ConfigError) as e:  # each dialect's own keys (config.ENDPOINT_SETTINGS), Anthropic's too
        parse_config(config("azure", 'anthropic_version = "2023-06-01"'), "my.toml")
    assert str(e.value).endswith(
        'endpoints[0].anthropic_version: only for api = "anthropic" (this endpoint is api = "azure")'
    )
    with pytest.raises(ConfigError) as e:
        parse_config(config("azure", 'api_version = "2024 10"'), "my.toml")
    assert "endpoints[0].api_version" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config(config(client='refused_sampling = "ignore"'), "my.toml")
    assert "client.refused_sampling" in str(e.value) and "'drop'" in str(e.value)
    cfg = parse_config(config(), "my.toml")
    assert cfg.endpoints[0].api is EndpointApi.OPENAI  # the default: today's behaviour
    assert cfg.endpoints[0].anthropic_version is AnthropicVersion.V2026_10_21
    assert cfg.client.refused_sampling is DropRule.DROP


# ---------------------------------------------------------------- bodies


def test_same_format_passes_every_field_through_but_the_cap_and_n() -> None:
    request = Request.of("hi", temperature=0.3, seed=7, logprobs=True, stream_options={"include_usage": True})
    out = body(target("openai"), request, stream=True)
    assert out == {
        "wire": Format.CHAT,
        "dropped": (),
        "seed": 7,
        "logprobs": True,
        "stream_options": {"include_usage": True},
        "model": "deploy-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100,
        "n": 1,
        "temperature": 0.3,
        "stream": True,
    }
    anthropic = {"messages": [{"role": "user", "content": "hi"}], "top_k": 5, "thinking": {"type": "enabled"}}
    out = body(target("anthropic", 'anthropic_version = "2023-06-01"'), Request.anthropic(anthropic))
    assert out == {"wire": Format.MESSAGES, "dropped": (), **anthropic, "model": "deploy-4o", "max_tokens": 100}


def test_a_chat_request_to_an_anthropic_endpoint_is_translated() -> None:
    request = Request.of(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=500,
        stop=["END"],
    )
    out = body(target("anthropic", 'anthropic_version = "2023-06-01"'), request, stream=True)
    assert out == {
        "wire": Format.MESSAGES,
        "dropped": (),
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "system": "be brief",
        "stop_sequences": ["END"],
        "model": "deploy-4o",
        "max_tokens": 500,  # the caller's own 500 is kept, above the model's 100 (the default)
        "stream": True,
    }


def test_a_messages_request_to_an_openai_endpoint_is_translated_and_streams_ask_for_usage() -> None:
    request = Request.anthropic(
        {"system": "be brief", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "temperature": 0.2}
    )
    out = body(target("azure"), request, stream=True)
    assert out == {
        "wire": Format.CHAT,
        "dropped": (),
        "temperature": 0.2,
        "stream_options": {"include_usage": True},
        "model": "deploy-4o",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 50,
        "n": 1,
        "stream": True,
    }


@pytest.mark.parametrize("caller", ["chat", "messages"])
def test_sampling_refused_by_2026_10_21_is_dropped_and_said_or_skips_by_the_rule(caller: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    request = (
        Request.of(messages, temperature=0.5, top_p=0.9)
        if caller == "chat"
        else Request.anthropic({"messages": messages, "temperature": 0.5, "top_p": 0.9, "top_k": 3})
    )
    current = target("anthropic")
    out = body(current, request)
    assert out["dropped"] == (("temperature", "top_p") if caller == "chat" else ("temperature", "top_p", "top_k"))
    assert not {"temperature", "top_p", "top_k"} & set(out)
    assert formats.incapable(request, current, ClientConfig()) is None
    why = formats.incapable(request, current, SKIP_SAMPLING)
    assert why is not None and why.startswith("temperature, top_p") and "2026-10-21" in why and '"skip"' in why
    older = target("anthropic", 'anthropic_version = "2023-06-01"')
    kept = body(older, request)
    assert kept["dropped"] == () and kept["temperature"] == 0.5  # 2023-06-01 takes them
    assert formats.incapable(request, older, SKIP_SAMPLING) is None


# Claude Code 2.1.197's first request, cut down: every hint it sends and a mid-conversation
# system message (captured from `claude -p "Say hello"` against capmon serve).
CACHED = {"type": "ephemeral"}
CLAUDE_CODE = {
    "system": [
        {"type": "text", "text": "billing"},
        {"type": "text", "text": "You are an agent.", "cache_control": CACHED},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Say hello", "cache_control": CACHED}]},
        {"role": "system", "content": "Available agent types: claude."},
    ],
    "tools": [
        {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}, "cache_control": CACHED}
    ],
    "metadata": {"user_id": "device-1"},
    "max_tokens": 32000,
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
}
HINTS = ("cache_control", "thinking", "output_config.effort", "context_management")


def test_anthropic_hints_an_openai_target_cannot_honour_are_dropped_and_said_or_skip_by_the_rule() -> None:
    request = Request.anthropic(CLAUDE_CODE)
    openai_target = target("openai")
    out = body(openai_target, request)
    assert out["wire"] is Format.CHAT and out["dropped"] == HINTS
    assert "cache_control" not in json.dumps([out["messages"], out["tools"]]) and not {
        "thinking",
        "output_config",
        "context_management",
    } & set(out)
    assert [m["role"] for m in out["messages"]] == ["system", "user", "system"]
    assert out["messages"][2]["content"] == "Available agent types: claude."
    assert out["tools"][0]["function"]["name"] == "Read"
    assert formats.incapable(request, openai_target, ClientConfig()) is None
    why = formats.incapable(request, openai_target, ClientConfig(unhonoured_hints=DropRule.SKIP))
    assert why is not None and why.startswith(", ".join(HINTS)) and 'unhonoured_hints = "skip"' in why
    # the same format: every field passes through untouched, nothing said
    same = body(target("anthropic"), request)
    assert (
        same["dropped"] == () and same["thinking"] == {"type": "adaptive"} and same["system"] == CLAUDE_CODE["system"]
    )
    assert (
        same["messages"] == CLAUDE_CODE["messages"] and same["context_management"] == CLAUDE_CODE["context_management"]
    )


@pytest.mark.parametrize(
    ("request_", "api", "extra", "reason"),
    [
        (Request.of("hi", n=2), "anthropic", "", "n = 2"),
        (Request.of("hi", logprobs=True), "anthropic", "", "logprobs"),
        (Request.of("hi", modalities=["text", "audio"]), "anthropic", "", "audio"),
        (Request.responses({"input": "hi", "tools": [{"type": "web_search"}]}), "anthropic", "", "web_search"),
        (
            Request.anthropic({"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "enabled"}}),
            "openai",
            "",
            "thinking",
        ),
        (
            Request.anthropic(
                {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]}]}
            ),
            "openai",
            "",
            "",  # an empty cache_control asks for nothing
        ),
        (
            Request.anthropic(
                {
                    "messages": [{"role": "user", "content": "hi"}],
                    "thinking": {"type": "enabled", "budget_tokens": 2048},
                }
            ),
            "openai",
            "",
            "thinking",  # asks for reasoning output: no hint
        ),
        (
            Request.anthropic({"messages": [{"role": "user", "content": "hi"}], "output_config": {"effort": "low"}}),
            "openai",
            "",
            "effort",  # less than the default effort changes the answer
        ),
        (
            Request.anthropic(
                {
                    "messages": [{"role": "user", "content": "hi"}],
                    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
                }
            ),
            "openai",
            "",
            "context_management",  # clearing tool results changes what the model sees
        ),
        (
            Request.anthropic(
                {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "citations": [{}]}]}]}
            ),
            "anthropic",
            "",
            "citations on a user text block",  # the version's own refusal, same format
        ),
        (Request.responses({"input": "hi"}), "azure", 'api_version = "2024-10-21"', "deployment URL"),
        (Request.responses({"input": "hi"}), "azure", "", ""),
        (Request.of("hi", n=2), "azure", "", ""),  # same format: untouched, never checked
    ],
)
def test_what_a_target_cannot_carry_makes_it_incapable_with_the_reason(
    request_: Request, api: str, extra: str, reason: str
) -> None:
    why = formats.incapable(request_, target(api, extra), ClientConfig())
    if reason:
        assert why is not None and reason in why
    else:
        assert why is None


def test_the_probe_speaks_the_targets_own_wire() -> None:
    api, probe = formats.probe_body(target("anthropic"), TokenParam.MAX_TOKENS)
    assert api is Format.MESSAGES and probe["max_tokens"] == 1 and probe["model"] == "deploy-4o"
    api, probe = formats.probe_body(target("azure"), TokenParam.MAX_COMPLETION_TOKENS)
    assert api is Format.CHAT and probe["max_completion_tokens"] == 1


# ---------------------------------------------------------------- keys never shown


def test_an_azure_or_anthropic_key_header_is_redacted_even_when_capmon_does_not_hold_it() -> None:
    unheld = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    for line in (f"api-key: {unheld}", f"'x-api-key': '{unheld}'", f'"Api-Key": "{unheld}"', f"x-api-key={unheld}"):
        assert unheld not in redact(line), line
        assert unheld not in redact(line, hints=False), line
    assert "request-id: 0f1e2d3c4b5a69788796a5b4c3d2e1f0" == redact(f"request-id: {unheld}")  # ids stay


def test_a_held_key_never_reaches_an_exception_or_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    t = target("azure", 'api_version = "2024-10-21"')
    request = httpx.Request("POST", t.urls[Format.CHAT], headers=[(k, v) for k, v in t.http_headers])
    assert KEY not in _scrub(f"boom {dict(request.headers)}", request)
    with caplog.at_level(logging.DEBUG, logger="httpx"):
        logging.getLogger("httpx").debug("sent headers %s", dict(request.headers))
    assert KEY not in caplog.text and "[redacted]" in caplog.text
    assert KEY not in repr(t) and KEY not in repr(t.key)
