"""A stream that breaks after output is finished by the next attempt (issue 29, item 4):
the caller gets one whole answer in its own format, with no repeated and no missing text,
the end says it was continued and by whom, the access log has the `continued` record; a
model that refuses a prefill gets the instruction; half a tool call is never sent as whole;
a caller can opt out. Real HTTP against the simulator, the real SDKs as the gateway's clients."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.sim.streams import _WORDS
from tests.gateway.helpers import HELLO, data_of, running, scenario, spec, sse_frames

pytestmark = pytest.mark.looptime

WORDS = 60  # the answer's words (one token each), in chunks of 4
CUT = {"mode": "stream_cut", "after": 10, "model": "sim-flagship", "count": 1}  # after 40 of 60 tokens


def unbroken(text: str, words: int = WORDS) -> str:
    """The simulator's unbroken answer that ``text`` begins (its words run on through one cycle)."""
    said = text.split()
    n = len(_WORDS)
    for start in range(n):
        if all(_WORDS[(start + i) % n] == w for i, w in enumerate(said[:8])):
            return " ".join(_WORDS[(start + i) % n] for i in range(words))
    raise AssertionError(f"not an answer of the simulator: {text[:60]!r}")


def two_models(**kw: Any) -> Any:
    return scenario(spec("flagship", answer_tokens=WORDS), spec("medium", answer_tokens=WORDS, **kw))


async def overload_flagship_mid_stream(gw: Any) -> None:
    """The flagship's next stream ends in an in-stream overload after 10 tokens (once)."""
    await gw.sim_admin(
        "faults",
        {"mode": "stream_error", "after": 10, "dialect": "anthropic-stream", "model": "sim-flagship", "count": 1},
    )


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_chat_stream_cut_after_40_of_60_tokens_is_finished_whole(tmp_path: Path) -> None:
    where = tmp_path / "access.jsonl"
    async with (
        running(two_models(), models=("flagship", "medium"), gateway=f'access_log = "{where}"') as gw,
        gw.openai() as sdk,
    ):
        await gw.sim_admin("faults", CUT)
        stream = await sdk.chat.completions.create(
            model="auto", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == unbroken(text) and len(text.split()) == WORDS  # nothing repeated, nothing missing
    assert len({c.id for c in chunks}) == 1  # one answer
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    said = finish[0].model_extra["capmon_continued"]
    first40 = unbroken(text).split()[:40]
    assert said == [{"model": "flagship", "offset": len(" ".join(first40))}]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= WORDS  # both requests counted
    line = log_lines(where)[-1]
    assert line["status"] == 200 and line["continued"] == said


async def test_a_fallback_that_refuses_any_prefill_finishes_by_the_instruction(tmp_path: Path) -> None:
    # flagship (OpenAI's wire) breaks on an in-stream overload; claude on Anthropic's wire takes
    # over and refuses the prefill: the 400 is learned and the instruction finishes the answer.
    scn = scenario(
        spec("flagship", answer_tokens=WORDS), spec("claude", answer_tokens=WORDS, api="anthropic", prefill=False)
    )
    where = tmp_path / "access.jsonl"
    async with (
        running(scn, models=("flagship", "claude"), anthropic=("claude",), gateway=f'access_log = "{where}"') as gw,
        gw.anthropic() as sdk,
    ):
        await overload_flagship_mid_stream(gw)
        async with sdk.messages.stream(model="auto", max_tokens=64, messages=HELLO) as stream:
            events = [e async for e in stream]
            final = await stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds.count("message_start") == 1 and kinds[-1] == "message_stop"
    text = "".join(b.text for b in final.content if b.type == "text")
    assert len(final.content) == 1 and text == unbroken(text)  # the open block went on, whole
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.model_extra["capmon_continued"][0]["model"] == "claude"
    line = log_lines(where)[-1]
    assert line["status"] == 200 and line["continued"][0]["model"] == "claude"
    assert line["attempts"] == 3  # flagship broke; claude refused the prefill (learned), then went on
    assert final.stop_reason == "end_turn"


async def test_a_messages_prefill_continues_on_the_same_wire() -> None:
    scn = scenario(spec("claude", answer_tokens=WORDS, api="anthropic"), spec("flagship", answer_tokens=WORDS))
    async with running(scn, models=("claude", "flagship"), anthropic=("claude",)) as gw, gw.anthropic() as sdk:
        await gw.sim_admin("faults", {**CUT, "model": "sim-claude"})
        async with sdk.messages.stream(model="auto", max_tokens=64, messages=HELLO) as stream:
            events = [e async for e in stream]
            final = await stream.get_final_message()
    text = "".join(b.text for b in final.content if b.type == "text")
    assert text == unbroken(text)
    starts = [e for e in events if e.type == "content_block_start"]
    assert len(starts) == 1 and {getattr(e, "index", 0) for e in events if hasattr(e, "index")} == {0}
    assert final.usage.output_tokens >= WORDS


async def test_a_responses_stream_cut_is_finished_with_one_item_and_one_completion() -> None:
    async with running(two_models(), models=("flagship", "medium")) as gw, gw.openai() as sdk:
        await gw.sim_admin("faults", CUT)
        events = [e async for e in await sdk.responses.create(model="auto", input="hi", stream=True)]
    types = [e.type for e in events]
    assert types.count("response.created") == 1 and types.count("response.completed") == 1
    assert types[-1] == "response.completed" and types.count("response.output_item.added") == 1
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == unbroken(text)
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text
    ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert len(ids) == 1
    seqs = [e.sequence_number for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    completed = events[-1].response
    assert completed.id == events[0].response.id and completed.output_text == text
    assert completed.model_extra["capmon_continued"][0]["model"] == "flagship"


async def test_a_cut_inside_a_tool_calls_arguments_is_a_clear_error_never_half_a_call() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    async with running(two_models(), models=("flagship", "medium")) as gw, gw.http() as http:
        await gw.sim_admin("faults", {"mode": "stream_cut", "model": "sim-flagship", "count": 1})
        r = await http.post(
            "/v1/chat/completions",
            json={
                "model": "auto",
                "messages": [{"role": "user", "content": "run a shell command"}],
                "stream": True,
                "tools": tools,
                "tool_choice": "required",
            },
        )
    frames = sse_frames(r.text)
    last = json.loads(frames[-1]["data"])
    assert set(last) == {"error"} and "tool call" in last["error"]["message"]
    assert "data: [DONE]" not in r.text
    data = data_of(frames[:-1])
    assert not any(c.get("choices") and c["choices"][0].get("finish_reason") for c in data)  # never ended whole


async def test_opting_out_keeps_the_clear_in_band_error() -> None:
    async with running(two_models(), models=("flagship", "medium")) as gw, gw.http() as http:
        await gw.sim_admin("faults", CUT)
        r = await http.post(
            "/v1/chat/completions",
            headers={"x-capmon-continue": "false"},
            json={"model": "auto", "messages": HELLO, "stream": True},
        )
    frames = sse_frames(r.text)
    last = json.loads(frames[-1]["data"])
    assert set(last) == {"error"} and "stream ended before [DONE]" in last["error"]["message"]
    assert "data: [DONE]" not in r.text and "capmon_continued" not in r.text


async def test_a_library_stream_says_who_continued_it() -> None:
    async with running(two_models(), models=("flagship", "medium")) as gw:
        await gw.sim_admin("faults", CUT)
        stream = gw.client.stream_chunks(HELLO)
        texts = [t async for t in stream.texts()]
        result = stream.result
        await gw.sim_admin("faults", CUT)
        with pytest.raises(RequestFailed) as info:
            async for _ in gw.client.stream_chunks(HELLO, continuation=False):
                pass
    text = "".join(texts)
    assert result is not None and result.content == text == unbroken(text)
    assert [c.model for c in result.continued] == ["flagship"] and result.continued[0].offset > 0
    assert stream.continued == result.continued
    assert "stream broke after output was sent" in str(info.value)


async def test_a_chat_caller_is_continued_by_an_anthropic_model_through_the_hub_with_a_prefill(
    tmp_path: Path,
) -> None:
    # flagship overloads mid-stream (capacity: the next model at once); claude, on Anthropic's wire,
    # gets the chat request and its partial answer translated (a prefill) and goes on.
    scn = scenario(spec("flagship", answer_tokens=WORDS), spec("claude", answer_tokens=WORDS, api="anthropic"))
    where = tmp_path / "access.jsonl"
    async with (
        running(scn, models=("flagship", "claude"), anthropic=("claude",), gateway=f'access_log = "{where}"') as gw,
        gw.openai() as sdk,
    ):
        await overload_flagship_mid_stream(gw)
        stream = await sdk.chat.completions.create(model="auto", messages=HELLO, stream=True)
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == unbroken(text) and len(text.split()) == WORDS
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].model_extra["capmon_continued"][0]["model"] == "claude"
    line = log_lines(where)[-1]
    assert line["attempts"] == 2 and line["model_served"] == "flagship"  # no refusal: the prefill was taken
