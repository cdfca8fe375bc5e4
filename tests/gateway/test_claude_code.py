"""Claude Code's request through the gateway, as Claude Code 2.1.197 sends it (cut down
from one captured against capmon serve): a streamed POST /v1/messages?beta=true with
anthropic-version 2023-06-01, x-api-key, the mid-conversation-system beta and a system
message as messages[1], cache breakpoints on system, message and tool blocks, adaptive
thinking, the default effort and a clear-thinking context edit. Served by its
Anthropic-wire model the body passes untouched; with that model tripped an OpenAI-wire
model serves it, the hints left out and named in x-capmon-dropped."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.test_formats import CLAUDE_CODE, HINTS
from tests.gateway.helpers import data_of, running, scenario, spec, sse_frames

pytestmark = pytest.mark.looptime

HEADERS = {
    "anthropic-version": "2023-06-01",
    "x-api-key": "any-key-works-here",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,mid-conversation-system-2026-04-07",
    "x-app": "cli",
}


def _text(frames: list[dict[str, Any]]) -> str:
    return "".join(
        d["delta"]["text"] for d in data_of(frames) if d.get("type") == "content_block_delta" and "text" in d["delta"]
    )


async def test_claude_codes_request_is_served_by_its_model_and_by_an_openai_model_when_that_is_tripped() -> None:
    body = {**CLAUDE_CODE, "model": "claude", "stream": True}
    sim = scenario(spec("claude", api="anthropic"), spec("flagship"))
    async with running(sim, models=("claude", "flagship"), anthropic=("claude",)) as gw, gw.http() as http:
        same = await http.post("/v1/messages?beta=true", json=body, headers=HEADERS)
        gw.client.trip("claude")
        crossed = await http.post("/v1/messages?beta=true", json=body, headers=HEADERS)
    assert same.status_code == 200, same.text
    assert (same.headers["x-capmon-model"], same.headers["x-capmon-api"]) == ("claude", "anthropic")
    assert "x-capmon-dropped" not in same.headers  # the same format: every field passed untouched
    assert crossed.status_code == 200, crossed.text
    assert (crossed.headers["x-capmon-model"], crossed.headers["x-capmon-api"]) == ("flagship", "openai")
    assert crossed.headers["x-capmon-dropped"] == ",".join(HINTS)
    for reply in (same, crossed):
        frames = sse_frames(reply.text)
        assert [f["event"] for f in frames][0] == "message_start" and frames[-1]["event"] == "message_stop"
        assert len(_text(frames).split()) == 12  # the simulator's whole answer
