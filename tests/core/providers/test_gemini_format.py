"""Gemini's generateContent as a format: requests, answers and streams both ways through the
hub (with chat, Messages and the Responses API where the hub goes), what Gemini cannot carry,
the frames a stream reads as, the body an attempt sends, and a broken stream's splice. Every
Gemini shape produced is checked against google-genai's own types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.genai import types

from capmon.core.providers import formats, gemini_format, hub, splice
from capmon.core.providers.frames import FrameKind
from capmon.core.providers.sse import Frame
from capmon.core.providers.token_param import TokenParam
from capmon.core.types import canon
from capmon.core.types.config import DropRule
from capmon.core.types.failure import Kind
from capmon.core.types.result import Format, Request
from tests.core.test_formats import body as attempt_body
from tests.core.test_formats import target as endpoint

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL_DECLARATIONS = [
    {"functionDeclarations": [{"name": "weather", "description": "Now", "parametersJsonSchema": WEATHER}]}
]


def valid_request(body: dict[str, Any]) -> None:
    """The body is one google-genai's request types take (contents, config, tools)."""
    for content in body.get("contents", []):
        types.Content.model_validate(content)
    if "systemInstruction" in body:
        types.Content.model_validate(body["systemInstruction"])
    config = {**body.get("generationConfig", {}), "tools": body.get("tools"), "toolConfig": body.get("toolConfig")}
    types.GenerateContentConfig.model_validate({k: v for k, v in config.items() if v is not None})


def valid_answer(answer: dict[str, Any]) -> types.GenerateContentResponse:
    return types.GenerateContentResponse.model_validate(answer)


def gemini(*contents: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"contents": list(contents), **fields}


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


def model(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


def text(t: str) -> dict[str, Any]:
    return {"text": t}


CALL = {"functionCall": {"name": "weather", "args": {"city": "Paris"}}}
RESULT = {"functionResponse": {"name": "weather", "response": {"temp": 20}}}
IMAGE = {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}

# ---------------------------------------------------------------- requests, both ways

# (name, the Gemini body, the chat body it is, the Messages body it is)
BOTH_WAYS: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    (
        "text",
        gemini(user(text("Hi"))),
        {"messages": [{"role": "user", "content": "Hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]},
    ),
    (
        "system-stop-sampling-cap",
        gemini(
            user(text("Hi")),
            systemInstruction={"parts": [text("Be brief.")]},
            generationConfig={"maxOutputTokens": 50, "stopSequences": ["END"], "temperature": 0.5, "topP": 0.9},
        ),
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_completion_tokens": 50,
            "stop": ["END"],
            "temperature": 0.5,
            "top_p": 0.9,
        },
        {
            "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_tokens": 50,
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_p": 0.9,
        },
    ),
    (
        "image",
        gemini(user(text("What is it?"), IMAGE)),
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
    ),
    (
        "tools-call-result-choice",
        gemini(
            user(text("Weather in Paris?")),
            model(CALL),
            user(RESULT),
            tools=TOOL_DECLARATIONS,
            toolConfig={"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}},
        ),
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "gemini_0",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "gemini_0", "content": '{"temp": 20}'},
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
                    "content": [{"type": "tool_use", "id": "gemini_0", "name": "weather", "input": {"city": "Paris"}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "gemini_0", "content": '{"temp": 20}'}],
                },
            ],
            "tools": [{"name": "weather", "input_schema": WEATHER, "description": "Now"}],
            "tool_choice": {"type": "tool", "name": "weather"},
        },
    ),
    (
        "structured-output",
        gemini(
            user(text("Hi")), generationConfig={"responseMimeType": "application/json", "responseJsonSchema": WEATHER}
        ),
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": WEATHER}},
        },
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "output_config": {"format": {"type": "json_schema", "schema": WEATHER}},
        },
    ),
]


@pytest.mark.parametrize("name,body,chat,messages", BOTH_WAYS, ids=[row[0] for row in BOTH_WAYS])
def test_gemini_to_chat_and_messages(
    name: str, body: dict[str, Any], chat: dict[str, Any], messages: dict[str, Any]
) -> None:
    valid_request(body)
    assert hub.translate_request(body, Format.GEMINI, Format.CHAT) == (chat, ())
    assert hub.translate_request(body, Format.GEMINI, Format.MESSAGES) == (messages, ())


@pytest.mark.parametrize("name,body,chat,messages", BOTH_WAYS, ids=[row[0] for row in BOTH_WAYS])
def test_chat_and_messages_to_gemini(
    name: str, body: dict[str, Any], chat: dict[str, Any], messages: dict[str, Any]
) -> None:
    # Toward Gemini from another format a call carries no id: Gemini pairs them by name.
    expected = json.loads(json.dumps(body))
    for source, given in ((Format.CHAT, chat), (Format.MESSAGES, messages)):
        if source is Format.CHAT and "max_completion_tokens" in given:
            given = {**given, "max_tokens": given.pop("max_completion_tokens")}
        got, dropped = hub.translate_request({"model": "m", **given}, source, Format.GEMINI)
        valid_request(got)
        assert (got, dropped) == (expected, ())


def test_a_chat_conversation_with_parallel_calls_crosses_as_gemini_turns() -> None:
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
        "seed": 7,
        "frequency_penalty": 0.5,
        "response_format": {"type": "json_object"},
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": WEATHER, "strict": True}}],
    }
    got, _ = hub.translate_request(chat, Format.CHAT, Format.GEMINI)
    valid_request(got)
    assert got["contents"][1:] == [
        model(
            text("Checking."),
            {"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
            {"functionCall": {"name": "weather", "args": {"city": "Rome"}}},
        ),
        user(
            {"functionResponse": {"name": "weather", "response": {"output": "sunny"}}},
            {"functionResponse": {"name": "weather", "response": {"output": "rain"}}},
            text("And tomorrow?"),
        ),
    ]
    assert got["generationConfig"] == {"seed": 7, "frequencyPenalty": 0.5, "responseMimeType": "application/json"}
    # a strict tool is held to its schema: Gemini's VALIDATED mode
    assert got["toolConfig"] == {"functionCallingConfig": {"mode": "VALIDATED"}}


def test_a_responses_request_crosses_to_gemini() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "cold"},
        ],
        "tools": [{"type": "function", "name": "weather", "parameters": WEATHER, "strict": False}],
        "max_output_tokens": 30,
    }
    got, _ = hub.translate_request(body, Format.RESPONSES, Format.GEMINI)
    valid_request(got)
    assert got == gemini(
        user(text("Weather?")),
        model({"functionCall": {"name": "weather", "args": {"city": "Oslo"}}}),
        user({"functionResponse": {"name": "weather", "response": {"output": "cold"}}}),
        systemInstruction={"parts": [text("Be brief.")]},
        generationConfig={"maxOutputTokens": 30},
        tools=[{"functionDeclarations": [{"name": "weather", "parametersJsonSchema": WEATHER}]}],
    )
    with pytest.raises(hub.Incapable):
        hub.translate_request(got, Format.GEMINI, Format.RESPONSES)  # no format is sent as Responses


def test_what_only_gemini_says_stays_in_a_gemini_request_and_is_refused_elsewhere() -> None:
    body = gemini(
        user(text("Hi")),
        model({"text": "thinking...", "thought": True, "thoughtSignature": "c2ln"}, text("Hello")),
        user(text("Search it")),
        tools=[{"googleSearch": {}}, *TOOL_DECLARATIONS],
        safetySettings=[{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        cachedContent="cachedContents/abc",
        generationConfig={"topK": 40, "thinkingConfig": {"thinkingBudget": 1024}, "candidateCount": 1, "seed": 1},
        labels={"team": "a"},
    )
    request = gemini_format.decode_request(body)
    assert request.own.keys() == {
        "safetySettings",
        "cachedContent",
        "generationConfig.topK",
        "generationConfig.thinkingConfig",
    }
    assert request.aside == {"labels": {"team": "a"}, "generationConfig.candidateCount": 1, "generationConfig.seed": 1}
    assert [t.builtin for t in request.tools] == [True, False]  # in order; encoded, function tools come first
    assert request.messages[1].parts[0] == canon.Thinking("thinking...", "c2ln")
    same = gemini_format.encode_request(request)
    assert same == {**body, "tools": [*TOOL_DECLARATIONS, {"googleSearch": {}}]}
    for target in (Format.CHAT, Format.MESSAGES):
        with pytest.raises(hub.Incapable, match="safetySettings|googleSearch|topK|thinking"):
            hub.translate_request(body, Format.GEMINI, target)


# (name, a canon request's source body and format, the reason Gemini refuses it)
REFUSED: list[tuple[str, Format, dict[str, Any], str]] = [
    ("n", Format.CHAT, {"messages": [{"role": "user", "content": "Hi"}], "n": 2}, "n = 2"),
    ("logprobs", Format.CHAT, {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True}, "logprobs"),
    (
        "parallel-off",
        Format.CHAT,
        {"messages": [{"role": "user", "content": "Hi"}], "parallel_tool_calls": False},
        "parallel_tool_calls = false",
    ),
    (
        "six-stops",
        Format.MESSAGES,
        {"messages": [{"role": "user", "content": "Hi"}], "stop_sequences": list("abcdef")},
        "6 stop sequences",
    ),
    (
        "a-system-message-later",
        Format.CHAT,
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Now French."}]},
        r"messages\[1\]: a system message",
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
        "audio-out",
        Format.CHAT,
        {"messages": [{"role": "user", "content": "Hi"}], "modalities": ["text", "audio"]},
        "audio",
    ),
]


@pytest.mark.parametrize("name,source,body,reason", REFUSED, ids=[row[0] for row in REFUSED])
def test_what_gemini_cannot_carry_is_refused_naming_it(
    name: str, source: Format, body: dict[str, Any], reason: str
) -> None:
    with pytest.raises(hub.Incapable, match=reason):
        hub.translate_request({"model": "m", **body}, source, Format.GEMINI)


def test_a_gemini_schema_in_capitals_is_json_schema_elsewhere() -> None:
    declaration = {
        "name": "weather",
        "parameters": {"type": "OBJECT", "properties": {"type": {"type": "STRING", "enum": ["a"]}}},
    }
    body = gemini(user(text("Hi")), tools=[{"functionDeclarations": [declaration]}])
    chat, _ = hub.translate_request(body, Format.GEMINI, Format.CHAT)
    assert chat["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"type": {"type": "string", "enum": ["a"]}},
    }


def test_a_function_response_is_its_object_or_its_output_text() -> None:
    def result(response: Any) -> canon.ToolResult:
        body = gemini(model(CALL), user({"functionResponse": {"name": "weather", "response": response}}))
        part = gemini_format.decode_request(body).messages[1].parts[0]
        assert isinstance(part, canon.ToolResult)
        return part

    assert result({"output": "sunny"}) == canon.ToolResult("gemini_0", "sunny")
    assert result({"error": "no such city"}) == canon.ToolResult("gemini_0", "no such city", is_error=True)
    assert result({"temp": 20}) == canon.ToolResult("gemini_0", '{"temp": 20}')
    failed = {
        "model": "m",
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True}],
            },
        ],
    }
    got, _ = hub.translate_request(failed, Format.MESSAGES, Format.GEMINI)
    assert got["contents"][1] == user({"functionResponse": {"name": "weather", "response": {"error": "boom"}}})


def test_ids_a_gemini_caller_gave_are_kept_and_results_without_one_find_their_call_by_name() -> None:
    body = gemini(
        model(
            {"functionCall": {"id": "a1", "name": "f", "args": {}}},
            {"functionCall": {"name": "g", "args": {}}},
            {"functionCall": {"name": "g", "args": {"x": 1}}},
        ),
        user(
            {"functionResponse": {"name": "g", "response": {"output": "1"}}},
            {"functionResponse": {"id": "a1", "name": "f", "response": {"output": "2"}}},
            {"functionResponse": {"name": "g", "response": {"output": "3"}}},
        ),
    )
    request = gemini_format.decode_request(body)
    calls = [p.id for p in request.messages[0].parts if isinstance(p, canon.ToolCall)]
    results = [p.call_id for p in request.messages[1].parts if isinstance(p, canon.ToolResult)]
    assert calls == ["a1", "gemini_0", "gemini_1"] and results == ["gemini_0", "a1", "gemini_1"]
    assert gemini_format.encode_request(request) == body  # made ids are never sent to Gemini
    with pytest.raises(hub.Incapable, match="whose call is not in the conversation"):
        gemini_format.encode_request(gemini_format.decode_request(gemini(user(RESULT))))


# ---------------------------------------------------------------- answers, both ways

ANSWER = {
    "candidates": [
        {
            "content": {
                "role": "model",
                "parts": [
                    {"text": "Let me ", "thoughtSignature": "c2ln"},
                    {"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
                ],
            },
            "finishReason": "STOP",
            "index": 0,
            "safetyRatings": [],
        }
    ],
    "usageMetadata": {
        "promptTokenCount": 100,
        "cachedContentTokenCount": 40,
        "candidatesTokenCount": 20,
        "thoughtsTokenCount": 30,
        "totalTokenCount": 150,
    },
    "modelVersion": "gemini-2.5-flash",
    "responseId": "resp-ABC_123",
}


def test_a_gemini_answer_in_chat_and_messages_and_back() -> None:
    valid_answer(ANSWER)
    chat = hub.translate_answer(ANSWER, Format.GEMINI, Format.CHAT, created=7)
    message = chat["choices"][0]["message"]
    assert message["content"] == "Let me " and chat["choices"][0]["finish_reason"] == "tool_calls"
    call_id = message["tool_calls"][0]["id"]
    assert call_id == "gemini_ABC123x1" and message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert chat["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 50,
        "total_tokens": 150,
        "prompt_tokens_details": {"cached_tokens": 40, "cache_write_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 30},
    }
    messages = hub.translate_answer(ANSWER, Format.GEMINI, Format.MESSAGES, created=7)
    assert messages["stop_reason"] == "tool_use" and messages["usage"] == {
        "input_tokens": 60,
        "output_tokens": 50,
        "cache_read_input_tokens": 40,
    }
    expected_back = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        text("Let me "),
                        {"functionCall": {"id": call_id, "name": "weather", "args": {"city": "Paris"}}},
                    ],
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "modelVersion": "gemini-2.5-flash",
        "responseId": "resp-ABC_123",
        "usageMetadata": ANSWER["usageMetadata"],
    }
    back = hub.translate_answer(chat, Format.CHAT, Format.GEMINI, created=7)
    assert back == expected_back
    valid_answer(back)
    responses = hub.translate_answer(ANSWER, Format.GEMINI, Format.RESPONSES, created=7)
    assert [item["type"] for item in responses["output"]] == ["message", "function_call"]


def test_a_messages_answer_in_gemini() -> None:
    answer = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "anthropics"},
            {"type": "text", "text": "Hi", "citations": [{"type": "char_location", "cited_text": "x"}]},
        ],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 2},
    }
    got = hub.translate_answer(answer, Format.MESSAGES, Format.GEMINI, created=7)
    valid_answer(got)
    assert got["candidates"][0] == {
        "content": {"role": "model", "parts": [{"text": "hm", "thought": True}, text("Hi")]},
        "finishReason": "MAX_TOKENS",
        "index": 0,
    }
    assert got["usageMetadata"] == {
        "promptTokenCount": 5,
        "cachedContentTokenCount": 2,
        "candidatesTokenCount": 4,
        "totalTokenCount": 9,
    }
    assert gemini_format.text(got) == "Hi" and gemini_format.used_tokens(got) == 9


FINISHES = [
    ("STOP", "stop", "end_turn", "STOP"),
    ("MAX_TOKENS", "length", "max_tokens", "MAX_TOKENS"),
    ("SAFETY", "content_filter", "refusal", "SAFETY"),
    ("RECITATION", "content_filter", "refusal", "SAFETY"),
    ("BLOCKLIST", "content_filter", "refusal", "SAFETY"),
    ("PROHIBITED_CONTENT", "content_filter", "refusal", "SAFETY"),
    ("SPII", "content_filter", "refusal", "SAFETY"),
    ("IMAGE_SAFETY", "content_filter", "refusal", "SAFETY"),
    ("LANGUAGE", "stop", "LANGUAGE", "LANGUAGE"),
    ("OTHER", "stop", "OTHER", "OTHER"),
    ("MALFORMED_FUNCTION_CALL", "stop", "MALFORMED_FUNCTION_CALL", "MALFORMED_FUNCTION_CALL"),
    ("UNEXPECTED_TOOL_CALL", "stop", "UNEXPECTED_TOOL_CALL", "UNEXPECTED_TOOL_CALL"),
    ("TOO_MANY_TOOL_CALLS", "stop", "TOO_MANY_TOOL_CALLS", "TOO_MANY_TOOL_CALLS"),
    ("IMAGE_OTHER", "stop", "IMAGE_OTHER", "IMAGE_OTHER"),
]


@pytest.mark.parametrize("finish,chat,messages,back", FINISHES, ids=[row[0] for row in FINISHES])
def test_finish_reasons_map_as_faithfully_as_canon_allows(finish: str, chat: str, messages: str, back: str) -> None:
    answer = {"candidates": [{"content": {"role": "model", "parts": [text("x")]}, "finishReason": finish, "index": 0}]}
    valid_answer(answer)
    assert hub.translate_answer(answer, Format.GEMINI, Format.CHAT, created=1)["choices"][0]["finish_reason"] == chat
    told = hub.translate_answer(answer, Format.GEMINI, Format.MESSAGES, created=1)
    assert told["stop_reason"] == messages
    # and back from Messages: a reason only Gemini has returns as it was
    assert (
        hub.translate_answer(told, Format.MESSAGES, Format.GEMINI, created=1)["candidates"][0]["finishReason"] == back
    )


def test_a_blocked_prompt_is_an_answer_that_refuses() -> None:
    answer = {
        "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
        "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    }
    valid_answer(answer)
    assert gemini_format.parse(200, json.dumps(answer).encode()) == answer
    assert gemini_format.blocked(answer) == "PROHIBITED_CONTENT"
    chat = hub.translate_answer(answer, Format.GEMINI, Format.CHAT, created=1)
    assert chat["choices"][0]["finish_reason"] == "content_filter" and chat["choices"][0]["message"]["content"] == ""
    with pytest.raises(hub.Incapable, match="without a candidate"):
        gemini_format.decode_answer({"usageMetadata": {}})


# ---------------------------------------------------------------- streams, both ways

CHUNKS: list[dict[str, Any]] = [
    {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "pondering", "thought": True}]}, "index": 0}],
        "usageMetadata": {"promptTokenCount": 5, "totalTokenCount": 5},
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    },
    {
        "candidates": [{"content": {"role": "model", "parts": [text("Hel")]}, "index": 0}],
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    },
    {
        "candidates": [{"content": {"role": "model", "parts": [text("lo")]}, "index": 0}],
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    },
    {
        "candidates": [{"content": {"role": "model", "parts": [CALL]}, "index": 0}],
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    },
    {
        "candidates": [{"content": {"role": "model", "parts": [text("")]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {
            "promptTokenCount": 5,
            "candidatesTokenCount": 2,
            "thoughtsTokenCount": 3,
            "totalTokenCount": 10,
        },
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    },
]


def translated(source: Format, target: Format, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    translation = hub.Translation(source, target, created=7)
    return [out for e in events for out in translation.feed(e)] + translation.close()


def test_a_gemini_stream_in_messages_events() -> None:
    for chunk in CHUNKS:
        valid_answer(chunk)
    events = translated(Format.GEMINI, Format.MESSAGES, CHUNKS)
    assert [(e["type"], e.get("index")) for e in events] == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[0]["message"]["usage"] == {"input_tokens": 5}
    assert events[2]["delta"] == {"type": "thinking_delta", "thinking": "pondering"}
    assert events[9]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"] == {"input_tokens": 5, "output_tokens": 5}


def test_a_gemini_stream_in_chat_chunks() -> None:
    chunks = translated(Format.GEMINI, Format.CHAT, CHUNKS)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == "Hello"
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish == ["tool_calls"] and chunks[-1]["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("source", [Format.CHAT, Format.MESSAGES])
def test_another_formats_stream_in_gemini_chunks(source: Format) -> None:
    answer = gemini_format.decode_answer(
        {
            **CHUNKS[0],
            "candidates": [{"content": {"role": "model", "parts": [text("Hello"), CALL]}, "finishReason": "STOP"}],
        }
    )
    events = hub.told(answer, hub.FORMATS[source].stream_encoder(created=7, include_usage=True))
    chunks = translated(source, Format.GEMINI, events)
    for chunk in chunks:
        valid_answer(chunk)
    whole = gemini_format.assembler()
    for chunk in chunks:
        whole.add(chunk, False)
    assert whole.finished
    back = whole.answer()
    assert back is not None and gemini_format.text(back) == "Hello"
    assert [call[0] for call in gemini_format.tool_calls(back)] == ["weather"]
    assert back["candidates"][0]["finishReason"] == "STOP"
    assert all("usageMetadata" not in c for c in chunks[:-1]) and chunks[-1]["usageMetadata"]["promptTokenCount"] == 5


def test_a_stream_of_chunks_assembles_into_the_plain_answer() -> None:
    whole = gemini_format.assembler()
    for chunk in CHUNKS[:-1]:
        whole.add(chunk, False)
        assert not whole.finished
    whole.add(CHUNKS[-1], False)
    assert whole.finished
    answer = whole.answer()
    assert answer == {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": "pondering", "thought": True}, text("Hello"), CALL]},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": CHUNKS[-1]["usageMetadata"],
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    }
    assert gemini_format.text(answer) == "Hello" and gemini_format.used_tokens(answer) == 10
    assert [gemini_format.chunk_text(c) for c in CHUNKS] == ["", "Hel", "lo", "", ""]


# ---------------------------------------------------------------- frames

OVERLOADED = {
    "error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}
}
FRAMES: list[tuple[str, str, FrameKind, bool, Kind | None]] = [
    ("thought", json.dumps(CHUNKS[0]), FrameKind.CHUNK, True, None),
    ("text", json.dumps(CHUNKS[1]), FrameKind.CHUNK, True, None),
    ("call", json.dumps(CHUNKS[3]), FrameKind.CHUNK, True, None),
    ("finish", json.dumps(CHUNKS[4]), FrameKind.CHUNK, True, None),
    (
        "usage-only",
        json.dumps({"usageMetadata": {"promptTokenCount": 1}, "responseId": "r"}),
        FrameKind.CHUNK,
        False,
        None,
    ),
    ("blocked", json.dumps({"promptFeedback": {"blockReason": "SAFETY"}}), FrameKind.CHUNK, True, None),
    ("error", json.dumps(OVERLOADED), FrameKind.ERROR, False, Kind.CAPACITY),
    ("error-in-array", json.dumps([OVERLOADED]), FrameKind.ERROR, False, Kind.CAPACITY),
    ("raw-pretty-error", json.dumps(OVERLOADED, indent=2), FrameKind.ERROR, False, Kind.CAPACITY),
    (
        "error-rate",
        json.dumps({"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED"}}),
        FrameKind.ERROR,
        False,
        Kind.RATE_LIMITED,
    ),
    ("not-json", "{", FrameKind.BROKEN, False, Kind.TRANSIENT),
    ("json-no-chunk", '{"hello": 1}', FrameKind.BROKEN, False, Kind.TRANSIENT),
    ("a-list", "[1, 2]", FrameKind.BROKEN, False, Kind.TRANSIENT),
    ("empty", "", FrameKind.IGNORE, False, None),
]


@pytest.mark.parametrize("name,data,kind,output,failure", FRAMES, ids=[row[0] for row in FRAMES])
def test_each_frame_is_read_as_what_it_is(
    name: str, data: str, kind: FrameKind, output: bool, failure: Kind | None
) -> None:
    event = gemini_format.read_frame(Frame("", data), now=0)
    assert event.kind is kind and event.output is output
    assert (event.failure.kind if event.failure else None) is failure
    if kind is FrameKind.ERROR:
        assert event.failure is not None and event.failure.status in (429, 503)


def test_a_broken_call_in_a_stream_is_caught_as_its_chunk_comes() -> None:
    watcher = gemini_format.call_watcher()
    watcher.feed(CHUNKS[3])
    assert not watcher.last(CHUNKS[3]) and watcher.last(CHUNKS[4])
    broken = {"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": [1]}}]}}]}
    with pytest.raises(Exception, match="not an object"):
        watcher.feed(broken)


# ---------------------------------------------------------------- bodies an attempt sends


def test_the_callers_gemini_body_goes_untouched_but_the_cap_and_one_candidate() -> None:
    body = gemini(
        user(text("Hi")),
        model="ignored",
        generationConfig={"maxOutputTokens": 9000, "candidateCount": 3, "topK": 5},
        safetySettings=[],
    )
    request = Request.of_body(Format.GEMINI, body)
    assert request.max_tokens == 9000
    sent = gemini_format.wire_body(
        request, None, model="gemini-2.5-flash", limit=100, stream=True, token_param=TokenParam.MAX_TOKENS
    )
    assert sent == {
        "contents": body["contents"],
        "generationConfig": {"maxOutputTokens": 100, "candidateCount": 1, "topK": 5},
        "safetySettings": [],
    }
    assert body["generationConfig"]["maxOutputTokens"] == 9000  # the caller's own body is not changed
    assert not gemini_format.refused_token_param(object(), TokenParam.MAX_TOKENS)  # type: ignore[arg-type]
    probe = gemini_format.probe_body("gemini-2.5-flash", TokenParam.MAX_TOKENS)
    valid_request(probe)
    assert "model" not in probe and probe["generationConfig"] == {"maxOutputTokens": 1, "candidateCount": 1}


def test_a_plain_answer_is_parsed_and_an_error_body_is_not() -> None:
    assert gemini_format.parse(200, json.dumps(ANSWER).encode()) == ANSWER
    assert gemini_format.parse(200, json.dumps(OVERLOADED).encode()) is None
    assert gemini_format.parse(503, json.dumps(ANSWER).encode()) is None
    assert gemini_format.parse(200, b"{") is None and gemini_format.parse(200, b"") is None
    assert gemini_format.parse(200, b'{"candidates": []}') is None


# ---------------------------------------------------------------- continuing a broken answer


def test_a_broken_answer_is_continued_as_the_models_turn() -> None:
    request = Request.of_body(Format.GEMINI, gemini(user(text("Write"))))
    again = gemini_format.continued(request, "Once upon", "Go on.")
    assert again.extra["contents"][1:] == [model(text("Once upon")), user(text("Go on."))]
    assert request.extra["contents"] == [user(text("Write"))] and not gemini_format.takes_prefill()


def test_a_continuations_chunks_fit_the_callers_stream() -> None:
    s = gemini_format.splicer(prompt=40)
    s.out(CHUNKS[1])
    assert s.partial().text == "Hel" and s.partial().why_not is None
    s.begin("gemini-2.5-pro", "")
    first = {"candidates": [{"content": {"role": "model", "parts": [text("lo!")]}, "index": 0}], "responseId": "other"}
    assert s.fit(first) == [{**first, "responseId": "r1"}]
    last = s.fit(CHUNKS[4])
    assert last[0]["responseId"] == "r1" and last[0][splice.FIELD] == [{"model": "gemini-2.5-pro", "offset": 3}]
    usage = last[0]["usageMetadata"]
    assert usage["promptTokenCount"] == 45 and usage["candidatesTokenCount"] == 3 and usage["totalTokenCount"] == 51
    assert s.fit({"candidates": [{"content": {"parts": [text("")]}, "index": 0}]}) == []
    called = gemini_format.splicer(prompt=1)
    called.out(CHUNKS[3])
    assert called.partial().why_not == "the caller already had more than text (a tool call)"


def test_geminis_usage_is_bounded_where_it_is_read() -> None:
    hostile = {
        **ANSWER,
        "usageMetadata": {
            "promptTokenCount": 10**30,
            "candidatesTokenCount": -1,
            "totalTokenCount": 7,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 10**30}],
        },
    }
    got = formats.parse_plain(Format.GEMINI, 200, json.dumps(hostile).encode())
    assert got is not None and got["usageMetadata"] == {
        "totalTokenCount": 7,
        "promptTokensDetails": [{"modality": "TEXT"}],
    }
    assert formats.parse_plain(Format.GEMINI, 200, json.dumps(ANSWER).encode()) == ANSWER
    event = formats.WireReader(Format.GEMINI).read(Frame("", json.dumps(hostile)), now=0)
    assert event.chunk is not None and "promptTokenCount" not in event.chunk["usageMetadata"]


# ---------------------------------------------------------------- a Gemini caller, other endpoints


@pytest.mark.parametrize(
    "api,extra,wire",
    [
        ("openai", "", Format.CHAT),
        ("azure", 'api_version = "v1"', Format.CHAT),
        ("anthropic", 'anthropic_version = "2023-06-01"', Format.MESSAGES),
    ],
)
def test_a_gemini_request_to_another_endpoint_is_translated_with_its_cap(api: str, extra: str, wire: Format) -> None:
    request = Request.of_body(
        Format.GEMINI,
        gemini(
            user(text("hi")), systemInstruction={"parts": [text("be brief")]}, generationConfig={"maxOutputTokens": 50}
        ),
    )
    out = attempt_body(endpoint(api, extra), request, stream=True)
    assert out["wire"] is wire and out["model"] == "deploy-4o" and out["stream"] is True
    if wire is Format.CHAT:
        assert out["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        assert out["max_tokens"] == 50 and out["stream_options"] == {"include_usage": True}
    else:
        assert out["system"] == "be brief" and out["max_tokens"] == 50


def test_a_messages_request_with_its_hints_goes_to_gemini_without_them_said() -> None:
    body_ = {
        "model": "m",
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}],
        "top_k": 20,
    }
    got, hints = hub.translate_request(body_, Format.MESSAGES, Format.GEMINI, hints=DropRule.DROP)
    assert hints == ("cache_control",)
    assert got == gemini(
        user(text("hi")), systemInstruction={"parts": [text("be brief")]}, generationConfig={"topK": 20}
    )
    with pytest.raises(hub.Incapable, match="cache_control"):
        hub.translate_request(body_, Format.MESSAGES, Format.GEMINI, hints=DropRule.SKIP)


def test_empty_text_and_empty_turns_are_not_sent_to_gemini() -> None:
    chat = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "again"}]},
        ],
    }
    got, _ = hub.translate_request(chat, Format.CHAT, Format.GEMINI)
    assert got == gemini(user(text("hi"), text("again")))
