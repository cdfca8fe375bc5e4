"""Bedrock's Converse as a format: requests, answers and streams both ways through the hub
(with chat, Messages and Gemini, and the Responses API where the hub goes), what Converse
cannot carry, the frames a ConverseStream reads as, the body an attempt sends, and a broken
stream's splice. Every Converse request produced is checked against botocore's own model of
the bedrock-runtime API (its parameter validator)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import botocore.session
import pytest
from botocore.validate import ParamValidator

from capmon.core.providers import converse_format, formats, hub, splice
from capmon.core.providers.frames import FrameKind
from capmon.core.providers.sse import Frame
from capmon.core.providers.token_param import TokenParam
from capmon.core.providers.tokens import estimate_request
from capmon.core.types import canon
from capmon.core.types.result import Format, Request

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
_MODEL = botocore.session.get_session().get_service_model("bedrock-runtime")


def valid_request(body: dict[str, Any]) -> None:
    """The body is one boto3's ``converse`` takes (its modelId is the URL's, added here)."""
    report = ParamValidator().validate({"modelId": "m", **body}, _MODEL.operation_model("Converse").input_shape)
    assert not report.has_errors(), report.generate_report()


def converse(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"messages": list(messages), **fields}


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def text(t: str) -> dict[str, Any]:
    return {"text": t}


USE = {"toolUse": {"toolUseId": "tooluse_1", "name": "weather", "input": {"city": "Paris"}}}
RESULT = {"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": '{"temp": 20}'}]}}
IMAGE = {"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}}
TOOLS = {"tools": [{"toolSpec": {"name": "weather", "description": "Now", "inputSchema": {"json": WEATHER}}}]}

# ---------------------------------------------------------------- requests, both ways

# (name, the Converse body, the chat body it is, the Messages body it is, the Gemini body it is)
BOTH_WAYS: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    (
        "text",
        converse(user(text("Hi"))),
        {"messages": [{"role": "user", "content": "Hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]},
        {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]},
    ),
    (
        "system-stop-sampling-cap",
        converse(
            user(text("Hi")),
            system=[text("Be brief.")],
            inferenceConfig={"maxTokens": 50, "temperature": 0.5, "topP": 0.9, "stopSequences": ["END"]},
        ),
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_completion_tokens": 50,
            "stop": ["END"],
            "temperature": 0.5,
            "top_p": 0.9,
        },
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "system": "Be brief.",
            "max_tokens": 50,
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_p": 0.9,
        },
        {
            "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "generationConfig": {"maxOutputTokens": 50, "stopSequences": ["END"], "temperature": 0.5, "topP": 0.9},
        },
    ),
    (
        "image",
        converse(user(text("What is it?"), IMAGE)),
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is it?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                    ],
                }
            ]
        },
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is it?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                        },
                    ],
                }
            ]
        },
        {
            "contents": [
                {
                    "role": "user",
                    "parts": [
                        {"text": "What is it?"},
                        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                    ],
                }
            ]
        },
    ),
    (
        "tools-use-result-choice",
        converse(
            user(text("Weather in Paris?")),
            assistant(USE),
            user(RESULT),
            toolConfig={**TOOLS, "toolChoice": {"tool": {"name": "weather"}}},
        ),
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "tooluse_1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "tooluse_1", "content": '{"temp": 20}'},
            ],
            "tools": [
                {"type": "function", "function": {"name": "weather", "parameters": WEATHER, "description": "Now"}}
            ],
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
        },
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "tooluse_1", "name": "weather", "input": {"city": "Paris"}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "tooluse_1", "content": '{"temp": 20}'}],
                },
            ],
            "tools": [{"name": "weather", "input_schema": WEATHER, "description": "Now"}],
            "tool_choice": {"type": "tool", "name": "weather"},
        },
        {
            "contents": [
                {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "weather", "args": {"city": "Paris"}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "weather", "response": {"temp": 20}}}]},
            ],
            "tools": [
                {"functionDeclarations": [{"name": "weather", "description": "Now", "parametersJsonSchema": WEATHER}]}
            ],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}},
        },
    ),
]
IDS = [row[0] for row in BOTH_WAYS]


@pytest.mark.parametrize("name,body,chat,messages,gemini", BOTH_WAYS, ids=IDS)
def test_converse_to_chat_messages_and_gemini(
    name: str, body: dict[str, Any], chat: dict[str, Any], messages: dict[str, Any], gemini: dict[str, Any]
) -> None:
    valid_request(body)
    assert hub.translate_request(body, Format.CONVERSE, Format.CHAT) == (chat, ())
    assert hub.translate_request(body, Format.CONVERSE, Format.MESSAGES) == (messages, ())
    assert hub.translate_request(body, Format.CONVERSE, Format.GEMINI) == (gemini, ())


@pytest.mark.parametrize("name,body,chat,messages,gemini", BOTH_WAYS, ids=IDS)
def test_chat_messages_and_gemini_to_converse(
    name: str, body: dict[str, Any], chat: dict[str, Any], messages: dict[str, Any], gemini: dict[str, Any]
) -> None:
    for source, given in ((Format.CHAT, chat), (Format.MESSAGES, messages), (Format.GEMINI, gemini)):
        if source is Format.CHAT and "max_completion_tokens" in given:
            given = {**given, "max_tokens": given.pop("max_completion_tokens")}
        got, dropped = hub.translate_request({"model": "m", **given}, source, Format.CONVERSE)
        valid_request(got)
        if source is Format.GEMINI:  # Gemini's calls carry no ids: made ones, paired by name
            got = json.loads(json.dumps(got).replace("gemini_0", "tooluse_1"))
        assert (got, dropped) == (body, ()), source


def test_a_chat_conversation_with_parallel_calls_crosses_as_alternating_turns() -> None:
    calls = [
        {"id": f"call_{c}", "type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": c})}}
        for c in ("Paris", "Rome")
    ]
    chat = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "Both?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_Paris", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_Rome", "content": "rain"},
            {"role": "user", "content": "And tomorrow?"},
        ],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}],
        "tool_choice": "required",
        "seed": 7,
    }
    got, _ = hub.translate_request(chat, Format.CHAT, Format.CONVERSE)
    valid_request(got)
    assert got["messages"][1:] == [
        assistant(
            text("Checking."),
            {"toolUse": {"toolUseId": "call_Paris", "name": "weather", "input": {"city": "Paris"}}},
            {"toolUse": {"toolUseId": "call_Rome", "name": "weather", "input": {"city": "Rome"}}},
        ),
        user(
            {"toolResult": {"toolUseId": "call_Paris", "content": [text("sunny")]}},
            {"toolResult": {"toolUseId": "call_Rome", "content": [text("rain")]}},
            text("And tomorrow?"),
        ),
    ]
    assert got["toolConfig"]["toolChoice"] == {"any": {}} and "inferenceConfig" not in got  # the seed: no meaning


def test_a_failed_tool_result_and_a_json_one_cross() -> None:
    body = converse(
        assistant(USE),
        user(
            {"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": "no such city"}], "status": "error"}},
        ),
        toolConfig=TOOLS,
    )
    valid_request(body)
    messages, _ = hub.translate_request(body, Format.CONVERSE, Format.MESSAGES)
    assert messages["messages"][1]["content"] == [
        {"type": "tool_result", "tool_use_id": "tooluse_1", "content": "no such city", "is_error": True}
    ]
    back, _ = hub.translate_request(messages, Format.MESSAGES, Format.CONVERSE)
    assert back == body
    as_json = converse(
        assistant(USE), user({"toolResult": {"toolUseId": "tooluse_1", "content": [{"json": {"t": 1}}]}})
    )
    chat, _ = hub.translate_request(as_json, Format.CONVERSE, Format.CHAT)
    assert chat["messages"][-1] == {"role": "tool", "tool_call_id": "tooluse_1", "content": '{"t": 1}'}


def test_what_only_converse_says_stays_in_a_converse_request_and_is_refused_elsewhere() -> None:
    body = converse(
        user(text("Hi"), {"cachePoint": {"type": "default"}}),
        assistant({"reasoningContent": {"reasoningText": {"text": "hm", "signature": "c2ln"}}}, text("Hello")),
        user(text("Go on")),
        system=[text("Be brief."), {"cachePoint": {"type": "default"}}],
        additionalModelRequestFields={"top_k": 40},
        guardrailConfig={"guardrailIdentifier": "g1", "guardrailVersion": "1"},
        requestMetadata={"team": "a"},
        toolConfig={**TOOLS, "toolChoice": {"auto": {}}},
    )
    valid_request(body)
    request = converse_format.decode_request(body)
    assert request.own.keys() == {"additionalModelRequestFields", "guardrailConfig"}
    assert request.aside == {"requestMetadata": {"team": "a"}}
    assert request.messages[1].parts[0] == canon.Thinking("hm", "c2ln")
    assert converse_format.encode_request(request) == body
    for target in (Format.CHAT, Format.MESSAGES, Format.GEMINI):
        with pytest.raises(hub.Incapable, match="additionalModelRequestFields|guardrailConfig|cachePoint"):
            hub.translate_request(body, Format.CONVERSE, target)


# (name, a request's source format and body, the reason Converse refuses it)
REFUSED: list[tuple[str, Format, dict[str, Any], str]] = [
    ("n", Format.CHAT, {"messages": [{"role": "user", "content": "Hi"}], "n": 2}, "n = 2"),
    ("logprobs", Format.CHAT, {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True}, "logprobs"),
    (
        "penalty",
        Format.CHAT,
        {"messages": [{"role": "user", "content": "Hi"}], "presence_penalty": 1},
        "presence_penalty",
    ),
    (
        "parallel-off",
        Format.CHAT,
        {"messages": [{"role": "user", "content": "Hi"}], "parallel_tool_calls": False},
        "parallel_tool_calls = false",
    ),
    (
        "choice-none",
        Format.CHAT,
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": WEATHER}}],
            "tool_choice": "none",
        },
        'tool_choice "none"',
    ),
    (
        "image-by-url",
        Format.CHAT,
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}
            ]
        },
        "an image by URL",
    ),
    (
        "thinking-in-history",
        Format.MESSAGES,
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]},
                {"role": "user", "content": "Go on"},
            ]
        },
        r"messages\[1\]: a thinking part",
    ),
    (
        "thinking-asked",
        Format.MESSAGES,
        {"messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "enabled", "budget_tokens": 2000}},
        "thinking",
    ),
    (
        "a-web-search-tool",
        Format.MESSAGES,
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        "a built-in web_search_20250305 tool",
    ),
    (
        "gemini-safety",
        Format.GEMINI,
        {"contents": [{"parts": [{"text": "Hi"}]}], "safetySettings": []},
        "safetySettings",
    ),
]


def test_structured_output_strict_tools_and_an_effort_cross_to_converses_own_fields() -> None:
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": WEATHER, "strict": True}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": WEATHER}},
    }
    got, _ = hub.translate_request(chat, Format.CHAT, Format.CONVERSE)
    valid_request(got)
    assert got["toolConfig"]["tools"][0]["toolSpec"]["strict"] is True
    schema = {"schema": json.dumps(WEATHER), "name": "answer"}
    assert got["outputConfig"] == {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": schema}}}
    request = converse_format.decode_request(got)
    assert request.output == canon.OutputSchema(WEATHER, "answer") and request.tools[0].strict is True
    assert converse_format.encode_request(request) == got
    # an effort: Anthropic's output_config.effort is Converse's outputConfig.effort
    asked = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "output_config": {"effort": "low"}}
    there, _ = hub.translate_request(asked, Format.MESSAGES, Format.CONVERSE)
    valid_request(there)
    assert there["outputConfig"] == {"effort": "low"}
    assert converse_format.decode_request(there).effort == "low"
    responses = {"model": "m", "input": "Hi", "reasoning": {"effort": "minimal"}}
    with pytest.raises(hub.Incapable, match="reasoning effort = minimal"):
        hub.translate_request(responses, Format.RESPONSES, Format.CONVERSE)


@pytest.mark.parametrize("name,source,body,reason", REFUSED, ids=[row[0] for row in REFUSED])
def test_what_converse_cannot_carry_is_refused_naming_it(
    name: str, source: Format, body: dict[str, Any], reason: str
) -> None:
    with pytest.raises(hub.Incapable, match=reason):
        hub.translate_request({"model": "m", **body}, source, Format.CONVERSE)


# ---------------------------------------------------------------- answers, both ways

ANSWER = {
    "output": {
        "message": {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "hm", "signature": "c2ln"}}},
                {"text": "Let me look."},
                {"toolUse": {"toolUseId": "tooluse_A1", "name": "weather", "input": {"city": "Paris"}}},
            ],
        }
    },
    "stopReason": "tool_use",
    "usage": {
        "inputTokens": 60,
        "outputTokens": 50,
        "totalTokens": 150,
        "cacheReadInputTokens": 40,
        "cacheWriteInputTokens": 0,
    },
    "metrics": {"latencyMs": 812},
}


def test_a_converse_answer_in_chat_messages_and_gemini_and_back() -> None:
    chat = hub.translate_answer(ANSWER, Format.CONVERSE, Format.CHAT, created=7)
    message = chat["choices"][0]["message"]
    assert message["content"] == "Let me look." and chat["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"][0]["id"] == "tooluse_A1"
    assert chat["usage"]["prompt_tokens"] == 100 and chat["usage"]["total_tokens"] == 150
    messages = hub.translate_answer(ANSWER, Format.CONVERSE, Format.MESSAGES, created=7)
    assert [b["type"] for b in messages["content"]] == ["thinking", "text", "tool_use"]
    assert messages["content"][0] == {"type": "thinking", "thinking": "hm", "signature": "c2ln"}
    assert messages["stop_reason"] == "tool_use" and messages["usage"]["cache_read_input_tokens"] == 40
    back = hub.translate_answer(messages, Format.MESSAGES, Format.CONVERSE, created=7)
    assert back == {**ANSWER, "metrics": {"latencyMs": 0}}
    gemini = hub.translate_answer(ANSWER, Format.CONVERSE, Format.GEMINI, created=7)
    assert gemini["candidates"][0]["finishReason"] == "STOP"
    assert converse_format.text(ANSWER) == "Let me look." and converse_format.used_tokens(ANSWER) == 150
    assert list(converse_format.tool_calls(ANSWER)) == [("weather", "tooluse_A1", "")]


STOPS = [
    ("end_turn", "stop", "end_turn"),
    ("tool_use", "tool_calls", "tool_use"),
    ("max_tokens", "length", "max_tokens"),
    ("stop_sequence", "stop", "stop_sequence"),
    ("guardrail_intervened", "content_filter", "refusal"),
    ("content_filtered", "content_filter", "refusal"),
    ("model_context_window_exceeded", "length", "model_context_window_exceeded"),
    ("malformed_model_output", "stop", "malformed_model_output"),
    ("malformed_tool_use", "stop", "malformed_tool_use"),
]


@pytest.mark.parametrize("reason,finish,stop", STOPS, ids=[s[0] for s in STOPS])
def test_every_stop_reason_in_chat_and_messages(reason: str, finish: str, stop: str) -> None:
    answer = {**ANSWER, "output": {"message": {"role": "assistant", "content": [text("x")]}}, "stopReason": reason}
    if reason == "tool_use":
        answer = {**ANSWER, "stopReason": reason}
    assert (
        hub.translate_answer(answer, Format.CONVERSE, Format.CHAT, created=7)["choices"][0]["finish_reason"] == finish
    )
    messages = hub.translate_answer(answer, Format.CONVERSE, Format.MESSAGES, created=7)
    assert messages["stop_reason"] == stop
    back = hub.translate_answer(answer, Format.CONVERSE, Format.CONVERSE, created=7)
    assert back["stopReason"] == ("content_filtered" if reason == "guardrail_intervened" else reason)


def test_a_plain_answer_is_parsed_and_an_error_body_is_not() -> None:
    raw = json.dumps(ANSWER).encode()
    assert converse_format.parse(200, raw) == ANSWER
    assert converse_format.parse(200, b'{"message": "Too many requests"}') is None
    assert converse_format.parse(429, raw) is None
    with pytest.raises(hub.Incapable):
        converse_format.decode_answer({"stopReason": "end_turn"})


# ---------------------------------------------------------------- streams


def frames(*events: tuple[str, dict[str, Any]]) -> list[Frame]:
    return [Frame(kind, json.dumps({**payload, "p": "abcdefgh"})) for kind, payload in events]


TOOL_STREAM = frames(
    ("messageStart", {"role": "assistant"}),
    ("contentBlockDelta", {"delta": {"reasoningContent": {"text": "hm"}}, "contentBlockIndex": 0}),
    ("contentBlockDelta", {"delta": {"reasoningContent": {"signature": "c2ln"}}, "contentBlockIndex": 0}),
    ("contentBlockStop", {"contentBlockIndex": 0}),
    ("contentBlockDelta", {"delta": {"text": "Let me "}, "contentBlockIndex": 1}),
    ("contentBlockDelta", {"delta": {"text": "look."}, "contentBlockIndex": 1}),
    ("contentBlockStop", {"contentBlockIndex": 1}),
    (
        "contentBlockStart",
        {"start": {"toolUse": {"toolUseId": "tooluse_A1", "name": "weather"}}, "contentBlockIndex": 2},
    ),
    ("contentBlockDelta", {"delta": {"toolUse": {"input": '{"city": '}}, "contentBlockIndex": 2}),
    ("contentBlockDelta", {"delta": {"toolUse": {"input": '"Paris"}'}}, "contentBlockIndex": 2}),
    ("contentBlockStop", {"contentBlockIndex": 2}),
    ("messageStop", {"stopReason": "tool_use"}),
    ("metadata", {"usage": ANSWER["usage"], "metrics": {"latencyMs": 812}}),
)


def read_all(stream: list[Frame]) -> formats.WireReader:
    reader = formats.WireReader(Format.CONVERSE)
    for f in stream:
        event = reader.read(f, now=0)
        assert event.chunk is not None and "p" not in next(iter(event.chunk.values()))
        reader.add(event.chunk, event.kind is FrameKind.DONE)
    return reader


def test_a_stream_is_chunks_its_output_marked_and_its_metadata_the_last() -> None:
    events = [converse_format.read_frame(f, now=0) for f in TOOL_STREAM]
    assert [e.kind for e in events] == [*[FrameKind.CHUNK] * 12, FrameKind.DONE]
    assert [e.output for e in events[:5]] == [False, True, True, False, True]
    assert events[11].output  # the stop


def test_a_stream_assembles_into_the_plain_answer_whole_at_its_stop() -> None:
    reader = read_all(TOOL_STREAM[:-1])
    assert reader.finished  # messageStop: whole, whether or not the metadata follows
    assert read_all(TOOL_STREAM).answer() == ANSWER
    assert not read_all(TOOL_STREAM[:-2]).finished


def _translated(stream: list[Frame], target: Format) -> list[Mapping[str, Any]]:
    request = Request.of_body(target, {"messages": []} if target is not Format.GEMINI else {"contents": []})
    codec = formats.stream_codec(request, Format.CONVERSE, created=7)
    out: list[Mapping[str, Any]] = []
    for f in stream:
        event = converse_format.read_frame(f, now=0)
        assert event.chunk is not None
        out += codec.feed(event.chunk)
    return out + list(codec.close())


def test_a_stream_crosses_to_messages_and_chat_ending_whole_with_its_usage() -> None:
    messages = _translated(TOOL_STREAM, Format.MESSAGES)
    kinds = [e["type"] for e in messages]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert messages[-2]["delta"]["stop_reason"] == "tool_use" and messages[-2]["usage"]["output_tokens"] == 50
    calls = [e for e in messages if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    assert calls[0]["content_block"]["id"] == "tooluse_A1"
    chat = _translated(TOOL_STREAM, Format.CHAT)
    assert chat[-1]["choices"] == [] or chat[-1]["choices"][0]["finish_reason"] == "tool_calls"
    said = "".join(c["choices"][0]["delta"].get("content") or "" for c in chat if c["choices"])
    assert said == "Let me look."


def test_a_stream_whose_metadata_never_comes_still_ends_whole_at_the_wires_end() -> None:
    messages = _translated(TOOL_STREAM[:-1], Format.MESSAGES)
    assert [e["type"] for e in messages][-2:] == ["message_delta", "message_stop"]


def test_a_broken_tool_input_is_a_broken_answer_across_formats() -> None:
    broken = [
        *TOOL_STREAM[:8],
        *frames(("contentBlockDelta", {"delta": {"toolUse": {"input": "{nope"}}, "contentBlockIndex": 2})),
        TOOL_STREAM[10],
    ]
    with pytest.raises(Exception, match="weather"):
        _translated(broken, Format.CHAT)


def test_other_formats_streams_cross_to_converse_events() -> None:
    answer = hub.translate_answer(ANSWER, Format.CONVERSE, Format.MESSAGES, created=7)
    events = formats.answer_as_stream(Format.MESSAGES, answer, created=7, include_usage=True)
    translation = hub.Translation(Format.MESSAGES, Format.CONVERSE, created=7)
    out = [e for event in events for e in translation.feed(event)] + translation.close()
    reader = formats.WireReader(Format.CONVERSE)
    for e in out:
        ((kind, payload),) = e.items()
        event = reader.read(Frame(kind, json.dumps(payload)), now=0)
        reader.add(e, event.kind is FrameKind.DONE)
    assert reader.answer() == {**ANSWER, "metrics": {"latencyMs": 0}}
    assert converse_format.answer_stream(ANSWER, created=7, include_usage=True)[-2] == {
        "messageStop": {"stopReason": "tool_use"}
    }


# ---------------------------------------------------------------- the body an attempt sends, the probe


def test_the_body_an_attempt_sends_has_the_cap_and_no_model_or_stream() -> None:
    request = Request.of_body(
        Format.CONVERSE,
        {"modelId": "x", "messages": [user(text("Hi"))], "inferenceConfig": {"maxTokens": 9000, "topP": 0.5}},
    )
    assert request.max_tokens == 9000
    body = converse_format.wire_body(
        request, None, model="m", limit=100, stream=True, token_param=TokenParam.MAX_TOKENS
    )
    assert body == {"messages": [user(text("Hi"))], "inferenceConfig": {"topP": 0.5, "maxTokens": 100}}
    probe = converse_format.probe_body("m", TokenParam.MAX_TOKENS)
    valid_request(probe)
    assert probe == {"messages": [user(text("ping"))], "inferenceConfig": {"maxTokens": 1}}


# ---------------------------------------------------------------- continuing a broken answer


def test_a_continuation_is_an_assistant_turn_and_its_splice_goes_on_from_the_text() -> None:
    request = Request.of_body(Format.CONVERSE, {"messages": [user(text("Tell me"))]})
    more = converse_format.continued(request, "Once upon", "Go on.")
    assert more.extra["messages"][1:] == [assistant(text("Once upon")), user(text("Go on."))]
    s = converse_format.splicer(10)
    s.out({"contentBlockDelta": {"delta": {"text": "Once upon "}, "contentBlockIndex": 0}})
    assert s.partial().text == "Once upon "
    s.begin("other", " ")
    assert s.fit({"messageStart": {"role": "assistant"}}) == []
    assert s.fit({"contentBlockDelta": {"delta": {"text": " a time"}, "contentBlockIndex": 0}}) == [
        {"contentBlockDelta": {"delta": {"text": "a time"}, "contentBlockIndex": 0}}
    ]
    stop = s.fit({"messageStop": {"stopReason": "end_turn"}})[0]
    assert stop["messageStop"][splice.FIELD] == [{"model": "other", "offset": 10}]
    meta = s.fit({"metadata": {"usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}}})[0]
    assert meta["metadata"]["usage"]["inputTokens"] == 11


def test_a_converse_requests_prompt_is_estimated_with_its_system_tools_and_tool_turns() -> None:
    bare = Request.of_body(Format.CONVERSE, converse(user(text("Weather in Paris?"))))
    full = Request.of_body(
        Format.CONVERSE,
        converse(
            user(text("Weather in Paris?")), assistant(USE), user(RESULT), system=[text("Be brief.")], toolConfig=TOOLS
        ),
    )
    chat = Request.of("Weather in Paris?")
    assert estimate_request(bare) == estimate_request(chat) > 0
    assert estimate_request(full) > estimate_request(bare) + 20  # the system prompt, the tool and its turns
