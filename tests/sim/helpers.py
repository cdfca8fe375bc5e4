"""Shared by the simulator's over-HTTP tests: a fast scenario, the demo key, and an SSE
reader that keeps what a lenient client would throw away (comments, event names)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import openai

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.scenario import ModelSpec, Scenario

AUTH = {"Authorization": f"Bearer {SIMULATOR_DEMO_KEY}"}
HELLO = [{"role": "user", "content": "Say something about capacity."}]


def fast_scenario(*, answer_tokens: int = 10, slots: int = 4, **model: Any) -> Scenario:
    """Real sockets and a real loop: latencies tiny enough that a test never waits."""
    return Scenario(
        name="t",
        models=(
            ModelSpec(
                name="sim-a",
                slots=slots,
                base_latency=0.001,
                per_token=0.0,
                noise=0.0,
                answer_tokens=answer_tokens,
                context_window=4000,
                **model,
            ),
            ModelSpec(name="sim-b", slots=4, base_latency=0.001, per_token=0.0, noise=0.0, answer_tokens=5),
        ),
    )


def openai_sdk(base_url: str) -> openai.AsyncOpenAI:
    """The real SDK on the simulator: the demo key, no retries (a test sees each answer)."""
    return openai.AsyncOpenAI(base_url=base_url, api_key=SIMULATOR_DEMO_KEY, max_retries=0)


def chat_body(model: str = "sim-a", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": HELLO, **extra}


@dataclass(frozen=True)
class Frame:
    event: str | None  # the `event:` line, if any
    data: str | None  # the joined `data:` lines, if any
    comment: str | None = None  # a `:` comment line

    def json(self) -> Any:
        assert self.data is not None
        return json.loads(self.data)


def frames(text: str) -> list[Frame]:
    """Split an SSE body into frames (blank-line separated), keeping comments as frames."""
    out: list[Frame] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        event, data, comment = None, [], None
        for line in block.split("\n"):
            if line.startswith(":"):
                comment = line[1:].strip()
            elif line.startswith("event:"):
                event = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].lstrip())
        out.append(Frame(event, "\n".join(data) if data else None, comment))
    return out


def data_frames(text: str) -> list[Any]:
    """The JSON of every data frame, [DONE] left out."""
    return [f.json() for f in frames(text) if f.data is not None and f.data != "[DONE]"]


def content_of(chunks: list[Any]) -> str:
    return "".join(
        (c["choices"][0].get("delta") or {}).get("content") or ""
        for c in chunks
        if c.get("choices") and "delta" in c["choices"][0]
    )
