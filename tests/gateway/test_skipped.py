"""A model the gateway passes over says why: a Codex-shaped request (its hosted web_search
tool, which no Anthropic-wire model can carry) goes past claude to medium, and the skip and
its reason are in ``x-capmon-skipped``, the access log, the events and the traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capmon.core.types import events as ev
from capmon.core.types.result import Skip
from capmon.gateway.headers import SKIPPED_CHARS, skipped_header
from tests.gateway.helpers import running
from tests.sim.test_tool_loop import CODEX_TOOLS

pytestmark = pytest.mark.looptime

# What Codex CLI 0.171 sends (its instructions and history cut short), captured at the gateway.
CODEX: dict[str, Any] = {
    "model": "auto",
    "instructions": "You are Codex, a coding agent.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: workspace"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]},
    ],
    "tools": CODEX_TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199a1b2-c3d4",
    "extra_body": {"client_metadata": {"session_id": "0199a1b2-c3d4", "turn_id": "t1"}},
}


async def test_a_codex_request_skips_the_model_that_cannot_carry_web_search_and_says_why(tmp_path: Path) -> None:
    where = tmp_path / "access.jsonl"
    seen: list[ev.Event] = []
    async with (
        running(models=("claude", "medium"), anthropic=("claude",), gateway=f'access_log = "{where}"') as gw,
        gw.openai() as sdk,
    ):
        gw.client.bus.subscribe(seen.append)
        plain = await sdk.responses.with_raw_response.create(**CODEX)
        async with sdk.responses.with_streaming_response.create(**CODEX, stream=True) as streamed:
            async for _ in streamed.iter_lines():
                pass
    for r in (plain, streamed):
        assert r.headers["x-capmon-model"] == "medium" and r.headers["x-capmon-attempts"] == "1"
        assert r.headers["x-capmon-fallbacks"] == "1"  # claude -> medium, passed over: one move
        skipped = r.headers["x-capmon-skipped"]
        assert skipped.startswith("claude@anthropic/claude-key=incapable (") and "web_search" in skipped, skipped
    lines = [json.loads(line) for line in where.read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        (skip,) = line["skipped"]
        assert (skip["target"], skip["why"]) == ("claude@anthropic/claude-key", "incapable")
        assert "web_search" in skip["reason"]
    events = [e for e in seen if isinstance(e, ev.TargetSkipped)]
    assert [(e.model, e.skip) for e in events] == [("claude", Skip.INCAPABLE)] * 2
    assert all("web_search" in e.reason for e in events)


def test_the_skipped_header_is_bounded_and_says_how_many_more() -> None:
    from capmon.core.types.result import Attempt, Decision

    detail = "full: every slot; it has is in use " + "and more " * 30

    def skip(i: int) -> Attempt:
        target = f"m{i}@ep/k"
        return Attempt(
            0, f"m{i}", target, "ep", "k", 0.0, None, None, detail, None, 0.0, 0.0, Decision.SKIP, skip=Skip.FULL
        )

    header = skipped_header([skip(i) for i in range(40)])
    assert header is not None and len(header) <= SKIPPED_CHARS
    assert header.startswith("m0@ep/k=full (every slot, it has is in use and more") and header.endswith(" more")
    assert "...); m1@ep/k=full" in header  # each entry's detail cut short
    assert header.isascii() and ";" not in header.split("; ")[0]  # an entry's own ";" never splits it
    assert skipped_header([]) is None
