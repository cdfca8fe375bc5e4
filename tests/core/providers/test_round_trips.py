"""Round trips through the hub, as properties: a request in any format taken into the canonical
types and back to its own format is unchanged (chat, Messages, Gemini, Converse: the formats the
hub encodes; no request is ever encoded as a Responses one), and a conversation every format can
say (text, a system prompt, stop sequences, sampling, a cap, tools, calls and their results,
a tool choice) crosses from each format to Gemini and back, and to Bedrock's Converse and back
(but a tool choice of "none", which Converse refuses), or from the Responses API to chat
directly and by way of Gemini, saying the same (call ids aside: Gemini pairs calls by name).
A Gemini or Converse answer told as its stream, directly or through Anthropic's events,
assembles back into itself."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capmon.core.providers import hub
from capmon.core.types.result import Format


def _not_an_object(text: str) -> bool:
    """A tool result's text Gemini can tell from an object (see gemini_format._function_response)."""
    try:
        return not isinstance(json.loads(text), dict)
    except ValueError:
        return True


texts = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=20)
results = texts.filter(_not_an_object)
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
NAMES = ("weather", "look_up")


@dataclass(frozen=True)
class Call:
    name: str
    args: dict[str, int]
    result: str


@dataclass(frozen=True)
class Exchange:
    """A user's turn and the model's answer: text, or calls (after some text), their results, then text."""

    user: str
    said: str | None
    calls: tuple[Call, ...]
    answer: str


@dataclass(frozen=True)
class Conversation:
    system: str | None
    exchanges: tuple[Exchange, ...]
    last: str
    stop: tuple[str, ...]
    temperature: float | None
    top_p: float | None
    cap: int | None
    choice: str | None  # auto, any, none


calls = st.builds(
    Call, st.sampled_from(NAMES), st.dictionaries(st.sampled_from("ab"), st.integers(-5, 5), max_size=2), results
)
exchanges = st.builds(Exchange, texts, st.one_of(st.none(), texts), st.lists(calls, max_size=2).map(tuple), texts)
unit = st.one_of(st.none(), st.floats(0, 1, allow_nan=False).map(lambda x: round(x, 3)))
conversations = st.builds(
    Conversation,
    st.one_of(st.none(), texts),
    st.lists(exchanges, max_size=3).map(tuple),
    texts,
    st.lists(texts, max_size=4).map(tuple),
    unit,
    unit,
    st.one_of(st.none(), st.integers(1, 10_000)),
    st.sampled_from([None, "auto", "any", "none"]),
)


def _ids(c: Conversation, prefix: str) -> list[list[str]]:
    n = 0
    out = []
    for e in c.exchanges:
        out.append([f"{prefix}{n + i}" for i in range(len(e.calls))])
        n += len(e.calls)
    return out


def _used(c: Conversation) -> list[str]:
    return sorted({call.name for e in c.exchanges for call in e.calls})


def _sampling(c: Conversation, body: dict[str, Any], names: tuple[str, str, str, str]) -> dict[str, Any]:
    for name, value in zip(names, (c.cap, list(c.stop) or None, c.temperature, c.top_p), strict=True):
        if value is not None:
            body[name] = value
    return body


def chat(c: Conversation) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": c.system}] if c.system else []
    for e, ids in zip(c.exchanges, _ids(c, "call_"), strict=True):
        messages.append({"role": "user", "content": e.user})
        if e.calls:
            tool_calls = [
                {"id": i, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.args)}}
                for i, call in zip(ids, e.calls, strict=True)
            ]
            messages.append({"role": "assistant", "content": e.said, "tool_calls": tool_calls})
            messages += [
                {"role": "tool", "tool_call_id": i, "content": call.result}
                for i, call in zip(ids, e.calls, strict=True)
            ]
        messages.append({"role": "assistant", "content": e.answer})
    messages.append({"role": "user", "content": c.last})
    body = _sampling(c, {"messages": messages}, ("max_completion_tokens", "stop", "temperature", "top_p"))
    if _used(c):
        body["tools"] = [{"type": "function", "function": {"name": n, "parameters": SCHEMA}} for n in _used(c)]
    if c.choice is not None:
        body["tool_choice"] = {"any": "required"}.get(c.choice, c.choice)
    return body


def _block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def messages(c: Conversation) -> dict[str, Any]:
    turns: list[dict[str, Any]] = []
    for e, ids in zip(c.exchanges, _ids(c, "toolu_"), strict=True):
        turns.append({"role": "user", "content": [_block(e.user)]})
        if e.calls:
            uses = [
                {"type": "tool_use", "id": i, "name": call.name, "input": call.args}
                for i, call in zip(ids, e.calls, strict=True)
            ]
            turns.append({"role": "assistant", "content": ([_block(e.said)] if e.said else []) + uses})
            results_ = [
                {"type": "tool_result", "tool_use_id": i, "content": call.result}
                for i, call in zip(ids, e.calls, strict=True)
            ]
            turns.append({"role": "user", "content": results_})
        turns.append({"role": "assistant", "content": [_block(e.answer)]})
    turns.append({"role": "user", "content": [_block(c.last)]})
    body = _sampling(c, {"messages": turns}, ("max_tokens", "stop_sequences", "temperature", "top_p"))
    if c.system:
        body["system"] = c.system
    if _used(c):
        body["tools"] = [{"name": n, "input_schema": SCHEMA} for n in _used(c)]
    if c.choice is not None:
        body["tool_choice"] = {"type": c.choice}
    return body


def gemini(c: Conversation) -> dict[str, Any]:
    contents: list[dict[str, Any]] = []
    for e in c.exchanges:
        contents.append({"role": "user", "parts": [{"text": e.user}]})
        if e.calls:
            said = [{"text": e.said}] if e.said else []
            made = [{"functionCall": {"name": call.name, "args": call.args}} for call in e.calls]
            contents.append({"role": "model", "parts": said + made})
            answers = [
                {"functionResponse": {"name": call.name, "response": {"output": call.result}}} for call in e.calls
            ]
            contents.append({"role": "user", "parts": answers})
        contents.append({"role": "model", "parts": [{"text": e.answer}]})
    contents.append({"role": "user", "parts": [{"text": c.last}]})
    body: dict[str, Any] = {"contents": contents}
    if c.system:
        body["systemInstruction"] = {"parts": [{"text": c.system}]}
    config = _sampling(c, {}, ("maxOutputTokens", "stopSequences", "temperature", "topP"))
    if config:
        body["generationConfig"] = config
    if _used(c):
        body["tools"] = [{"functionDeclarations": [{"name": n, "parametersJsonSchema": SCHEMA} for n in _used(c)]}]
    if c.choice is not None:
        body["toolConfig"] = {"functionCallingConfig": {"mode": c.choice.upper()}}
    return body


def converse(c: Conversation) -> dict[str, Any]:
    """Bedrock's Converse (which has no tool choice "none": :func:`says_in_converse`)."""
    assert says_in_converse(c)
    messages: list[dict[str, Any]] = []
    for e, ids in zip(c.exchanges, _ids(c, "tooluse_"), strict=True):
        messages.append({"role": "user", "content": [{"text": e.user}]})
        if e.calls:
            said = [{"text": e.said}] if e.said else []
            uses = [
                {"toolUse": {"toolUseId": i, "name": call.name, "input": call.args}}
                for i, call in zip(ids, e.calls, strict=True)
            ]
            messages.append({"role": "assistant", "content": said + uses})
            results_ = [
                {"toolResult": {"toolUseId": i, "content": [{"text": call.result}]}}
                for i, call in zip(ids, e.calls, strict=True)
            ]
            messages.append({"role": "user", "content": results_})
        messages.append({"role": "assistant", "content": [{"text": e.answer}]})
    messages.append({"role": "user", "content": [{"text": c.last}]})
    body: dict[str, Any] = {"messages": messages}
    if c.system:
        body["system"] = [{"text": c.system}]
    config = _sampling(c, {}, ("maxTokens", "stopSequences", "temperature", "topP"))
    if config:
        body["inferenceConfig"] = config
    tools: dict[str, Any] = {}
    if _used(c):
        tools["tools"] = [{"toolSpec": {"name": n, "inputSchema": {"json": SCHEMA}}} for n in _used(c)]
    if c.choice is not None:
        tools["toolChoice"] = {c.choice: {}}
    if tools:
        body["toolConfig"] = tools
    return body


def says_in_converse(c: Conversation) -> bool:
    """Whether Converse can say the conversation: all but a tool choice of "none"."""
    return c.choice != "none"


def responses(c: Conversation) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for e, ids in zip(c.exchanges, _ids(c, "call_"), strict=True):
        items.append({"role": "user", "content": e.user})
        if e.said and e.calls:
            items.append({"role": "assistant", "content": e.said})
        for i, call in zip(ids, e.calls, strict=True):
            items.append({"type": "function_call", "call_id": i, "name": call.name, "arguments": json.dumps(call.args)})
        items += [
            {"type": "function_call_output", "call_id": i, "output": call.result}
            for i, call in zip(ids, e.calls, strict=True)
        ]
        items.append({"role": "assistant", "content": e.answer})
    items.append({"role": "user", "content": c.last})
    body: dict[str, Any] = {"input": items}
    if c.system:
        body["instructions"] = c.system
    if c.cap is not None:
        body["max_output_tokens"] = c.cap
    for name, value in (("temperature", c.temperature), ("top_p", c.top_p)):
        if value is not None:
            body[name] = value
    if _used(c):
        body["tools"] = [{"type": "function", "name": n, "parameters": SCHEMA} for n in _used(c)]
    if c.choice is not None:
        body["tool_choice"] = {"any": "required"}.get(c.choice, c.choice)
    return body


BUILDERS: dict[Format, Callable[[Conversation], dict[str, Any]]] = {
    Format.CHAT: chat,
    Format.MESSAGES: messages,
    Format.GEMINI: gemini,
    Format.CONVERSE: converse,
}
_ID_KEYS = frozenset({"id", "tool_call_id", "tool_use_id", "call_id", "toolUseId"})


def renumbered(body: Any) -> Any:
    """``body`` with every call id named by its order of first appearance (``id0``, ``id1``, ...)."""
    seen: dict[str, str] = {}

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if key in _ID_KEYS and isinstance(value, str):
            return seen.setdefault(value, f"id{len(seen)}")
        return value

    return walk(body)


def test_the_hub_encodes_every_format_but_the_responses_api() -> None:
    assert set(BUILDERS) | {Format.RESPONSES} == set(Format) == set(hub.FORMATS)


@settings(max_examples=150, deadline=None)
@given(conversations)
def test_a_request_into_the_hub_and_back_to_its_own_format_is_unchanged(c: Conversation) -> None:
    for fmt, build in BUILDERS.items():
        if fmt is Format.CONVERSE and not says_in_converse(c):
            continue
        body = build(c)
        module = hub.FORMATS[fmt]
        assert module.encode_request(module.decode_request({"model": "m", "stream": True, **body})) == body, fmt


@settings(max_examples=150, deadline=None)
@given(conversations)
def test_a_conversation_every_format_says_crosses_to_gemini_and_back_saying_the_same(c: Conversation) -> None:
    expected = gemini(c)
    for fmt in (Format.CHAT, Format.MESSAGES):
        body = BUILDERS[fmt](c)
        there, dropped = hub.translate_request({"model": "m", **body}, fmt, Format.GEMINI)
        assert (there, dropped) == (expected, ()), fmt
        back, _ = hub.translate_request(there, Format.GEMINI, fmt)
        assert renumbered(back) == renumbered(body), fmt
    # and a Responses request, which no format is encoded as, says to chat what it says by way of Gemini
    body = {"model": "m", **responses(c)}
    direct, _ = hub.translate_request(body, Format.RESPONSES, Format.CHAT)
    by_gemini, _ = hub.translate_request(
        hub.translate_request(body, Format.RESPONSES, Format.GEMINI)[0], Format.GEMINI, Format.CHAT
    )
    assert renumbered(by_gemini) == renumbered(direct)


@settings(max_examples=150, deadline=None)
@given(conversations)
def test_a_conversation_every_format_says_crosses_to_converse_and_back_saying_the_same(c: Conversation) -> None:
    """Chat, Messages and Gemini to Bedrock's Converse and back (call ids aside: Gemini's are
    made); a tool choice of "none", which Converse has not, is refused naming it."""
    for fmt in (Format.CHAT, Format.MESSAGES, Format.GEMINI):
        body = BUILDERS[fmt](c)
        if not says_in_converse(c):
            with pytest.raises(hub.Incapable, match='tool_choice "none"'):
                hub.translate_request({"model": "m", **body}, fmt, Format.CONVERSE)
            continue
        there, dropped = hub.translate_request({"model": "m", **body}, fmt, Format.CONVERSE)
        assert (renumbered(there), dropped) == (renumbered(converse(c)), ()), fmt
        back, _ = hub.translate_request(there, Format.CONVERSE, fmt)
        assert renumbered(back) == renumbered(body), fmt


# ---------------------------------------------------------------- answers and their streams

_FINISHES = ["STOP", "MAX_TOKENS", "SAFETY", "LANGUAGE", "MALFORMED_FUNCTION_CALL"]
gemini_parts = st.lists(
    st.one_of(
        texts.map(lambda t: {"text": t}),
        texts.map(lambda t: {"text": t, "thought": True}),
        st.builds(
            lambda name, args, i: {"functionCall": {"id": f"c{i}", "name": name, "args": args}},
            st.sampled_from(NAMES),
            st.dictionaries(st.sampled_from("ab"), st.integers(-5, 5), max_size=2),
            st.integers(0, 99),
        ),
    ),
    max_size=5,
)


def _runs_joined(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parts as a stream tells them: a run of text (or of thought text) is one part."""
    out: list[dict[str, Any]] = []
    for p in parts:
        if out and "text" in p and "text" in out[-1] and p.get("thought") == out[-1].get("thought"):
            out[-1] = {**out[-1], "text": out[-1]["text"] + p["text"]}
        else:
            out.append(dict(p))
    return out


@settings(max_examples=150, deadline=None)
@given(gemini_parts, st.sampled_from(_FINISHES), st.integers(0, 500), st.integers(0, 500))
def test_a_gemini_answer_told_as_a_stream_and_through_messages_assembles_back(
    parts: list[dict[str, Any]], finish: str, prompt: int, out: int
) -> None:
    answer = {
        "candidates": [
            {"content": {"role": "model", "parts": _runs_joined(parts)}, "finishReason": finish, "index": 0}
        ],
        "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": out, "totalTokenCount": prompt + out},
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    }
    module = hub.FORMATS[Format.GEMINI]
    for chunks in (
        module.answer_stream(answer, created=1, include_usage=True),
        # by way of Anthropic's events: what both say crosses whole
        _through(
            hub.FORMATS[Format.MESSAGES].answer_stream(
                hub.translate_answer(answer, Format.GEMINI, Format.MESSAGES, created=1), created=1, include_usage=True
            )
        ),
    ):
        whole = module.assembler()
        for chunk in chunks:
            assert not whole.finished
            whole.add(chunk, False)
        assert whole.finished and whole.answer() == answer


def _through(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    translation = hub.Translation(Format.MESSAGES, Format.GEMINI, created=1)
    return [c for e in events for c in translation.feed(e)] + translation.close()


_STOP_REASONS = ["end_turn", "tool_use", "max_tokens", "stop_sequence", "model_context_window_exceeded"]
converse_blocks = st.lists(
    st.one_of(
        texts.map(lambda t: {"text": t}),
        st.builds(
            lambda t, sig: {"reasoningContent": {"reasoningText": {"text": t, "signature": sig}}},
            texts,
            st.sampled_from(["c2ln", "b3Ro"]),
        ),
        st.builds(
            lambda name, args, i: {"toolUse": {"toolUseId": f"tooluse_{i}", "name": name, "input": args}},
            st.sampled_from(NAMES),
            st.dictionaries(st.sampled_from("ab"), st.integers(-5, 5), max_size=2),
            st.integers(0, 99),
        ),
    ),
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(converse_blocks, st.sampled_from(_STOP_REASONS), st.integers(0, 500), st.integers(0, 500))
def test_a_converse_answer_told_as_a_stream_and_through_messages_assembles_back(
    blocks: list[dict[str, Any]], stop: str, prompt: int, out: int
) -> None:
    """Told as ConverseStream's events (a block per index, its pieces, the stop, the metadata),
    directly or by way of Anthropic's events, the events assemble into the same answer: whole
    at its messageStop, its usage at the metadata that follows."""
    answer = {
        "output": {"message": {"role": "assistant", "content": blocks}},
        "stopReason": stop,
        "usage": {"inputTokens": prompt, "outputTokens": out, "totalTokens": prompt + out},
        "metrics": {"latencyMs": 0},
    }
    module = hub.FORMATS[Format.CONVERSE]
    messages = hub.translate_answer(answer, Format.CONVERSE, Format.MESSAGES, created=1)
    translation = hub.Translation(Format.MESSAGES, Format.CONVERSE, created=1)
    through = hub.FORMATS[Format.MESSAGES].answer_stream(messages, created=1, include_usage=True)
    for events in (
        module.answer_stream(answer, created=1, include_usage=True),
        [c for e in through for c in translation.feed(e)] + translation.close(),
    ):
        whole = module.assembler()
        assert list(events[-2]) == ["messageStop"] and list(events[-1]) == ["metadata"]
        for event in events[:-1]:
            assert not whole.finished
            whole.add(event, False)
        assert whole.finished  # at its messageStop: whole, whether or not its metadata comes
        whole.add(events[-1], True)
        assert whole.answer() == answer
