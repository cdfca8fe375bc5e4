"""A request's prompt is estimated by its API (capmon/core/providers/tokens.py), so context windows
and token budgets see Anthropic Messages and Responses requests as they are, not as
empty chat requests: a long one skips a model whose window is too small, without
sending, and is served by a larger one. Over real HTTP against the simulator."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.providers.tokens import estimate_body, estimate_request, estimate_tokens
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.core.types.failure import Kind
from capmon.core.types.result import Format, Request, Skip, sent
from capmon.sim.scenario import Scenario
from tests.support.configs import build_config
from tests.support.simulated import StartSim, sim_model

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

LONG = "word " * 8_000  # 40,000 characters: about 10,000 tokens
TOOL = {"name": "Read", "description": "Read a file " * 100, "input_schema": {"type": "object"}}


def test_each_apis_prompt_is_counted_with_its_system_prompt_and_tools() -> None:
    text = [{"role": "user", "content": "x" * 400}]
    assert estimate_body(Format.MESSAGES, {"messages": text}) == estimate_tokens(text) == 104
    assert estimate_body(Format.MESSAGES, {"messages": text, "system": "y" * 400}) == 208
    tools = estimate_body(Format.MESSAGES, {"messages": text, "tools": [TOOL]}) - 104
    assert tools > 300  # the tool's JSON, description and schema, as text
    result = [
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "z" * 400}]}],
        },
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": "q" * 391}}]},
    ]
    # the tool result's text, the tool call's input as JSON ({"q": "..."}: 9 characters around it)
    assert estimate_body(Format.MESSAGES, {"messages": result}) == 100 + 100 + 2 * 4
    responses = {
        "instructions": "y" * 400,
        "input": [
            {"role": "user", "content": "x" * 400},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "a" * 400},
            {"type": "function_call_output", "call_id": "c", "output": "o" * 400},
        ],
    }
    assert estimate_body(Format.RESPONSES, responses) == 4 * 104
    assert estimate_body(Format.RESPONSES, {"input": "x" * 400}) == 104
    assert estimate_request(Request.anthropic({"messages": text, "system": "y" * 400})) == 208
    assert estimate_request(Request.responses({"input": "x" * 400, "instructions": "y" * 400})) == 208
    assert estimate_request(Request.of(text)) == 104
    gemini = {
        "systemInstruction": {"parts": [{"text": "y" * 400}]},
        "contents": [
            {"role": "user", "parts": [{"text": "x" * 400}]},
            {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"q": "q" * 350}}}]},
        ],
    }
    # the call as its part's JSON ({"functionCall": {"name": "f", "args": {"q": "..."}}}: 50 characters around it)
    assert estimate_body(Format.GEMINI, gemini) == 3 * 104
    assert estimate_request(Request.of_body(Format.GEMINI, gemini)) == 3 * 104


def _client(server: Any, api: str) -> FallbackClient:
    """small (a 4,000-token window) first, then large, both on the simulator's ``api`` wire."""
    base = server.origin if api == "anthropic" else server.base_url
    models = {
        m: {"api_model": f"sim-{m}", "context_window": w, "max_tokens": 64}
        for m, w in (("small", 4_000), ("large", 128_000))
    }
    cfg = build_config(base, endpoints={"ep": {"api": api}}, keys=[("KEY", None)], models=models)
    return FallbackClient(cfg, environ={"KEY": SIMULATOR_DEMO_KEY})


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_a_long_messages_or_responses_request_skips_a_window_too_small_and_falls_back(
    api: str, start_sim: StartSim
) -> None:
    small = dataclasses.replace(sim_model("small", api=api), context_window=4_000)
    server = await start_sim(Scenario(models=(small, sim_model("large", api=api)), keys=(SIMULATOR_DEMO_KEY,)))
    async with _client(server, api) as client:
        if api == "anthropic":
            result = await client.messages({"max_tokens": 64, "messages": [{"role": "user", "content": LONG}]})
            call = client.messages({"max_tokens": 64, "messages": [{"role": "user", "content": LONG * 40}]})
        else:
            result = await client.responses({"input": [{"role": "user", "content": LONG}]})
            call = client.responses({"input": LONG * 40})
        with pytest.raises(RequestFailed) as info:  # 400,000 tokens: over every window
            await call
        stats = server.simulator.stats()["models"]
    # small was never sent the request: its window (4,000) cannot hold ~10,000 tokens
    assert result.model == "large" and [a.model for a in sent(result.attempts)] == ["large"]
    assert [(a.model, a.skip) for a in result.skipped] == [("small", Skip.WINDOW)]
    assert info.value.failure.kind is Kind.TOO_LARGE and "context window" in info.value.failure.reason
    assert stats["sim-small"]["requests"] == 0 and stats["sim-large"]["requests"] == 1, stats
