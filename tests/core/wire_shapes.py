"""Streams and errors as real providers put them on the wire, for the wire-shape tables.

Each stream is the exact bytes of an SSE body; its expectation says what the client
must make of it: a complete answer (text, tool calls, usage), or a failure of a kind,
before or after output reached the caller. Where a shape comes from is named on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from capmon.core.types.failure import Kind


def sse(*frames: Any, done: bool = True, sep: str = "\n\n") -> bytes:
    """``data:`` frames (dicts as JSON, strings as written), then ``data: [DONE]``."""
    out = []
    for f in frames:
        if isinstance(f, bytes):
            out.append(f.decode())
        elif isinstance(f, str):
            out.append(f if f.endswith("\n") else f + sep)
        else:
            out.append("data: " + json.dumps(f) + sep)
    if done:
        out.append("data: [DONE]" + sep)
    return "".join(out).encode()


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1767225600,
        "model": "m",
        "choices": [choice],
        **extra,
    }


def role() -> dict[str, Any]:
    return chunk({"role": "assistant", "content": ""})


def text(piece: str, **extra: Any) -> dict[str, Any]:
    return chunk({"content": piece}, **extra)


@dataclass(frozen=True)
class Shape:
    name: str
    body: bytes
    text: str = ""  # the answer's text when it completes
    kind: Kind | None = None  # the failure's kind when it does not
    after_output: bool = False  # the failure came after output reached the caller
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] | None = None
    finish: str | None = "stop"


USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
AZURE_FILTER = {
    "hate": {"filtered": False, "severity": "safe"},
    "self_harm": {"filtered": False, "severity": "safe"},
    "sexual": {"filtered": False, "severity": "safe"},
    "violence": {"filtered": False, "severity": "safe"},
}
WEATHER_ARGS = '{"city": "Paris", "unit": "c"}'

STREAMS: list[Shape] = [
    # OpenAI chat completions: a role-only first delta, content deltas, a finish chunk.
    Shape("openai", sse(role(), text("Hello"), text(" world"), chunk({}, "stop")), "Hello world"),
    # OpenAI with stream_options.include_usage: every chunk has "usage": null, the last one
    # has "choices": [] and the usage.
    Shape(
        "openai-usage",
        sse(
            {**role(), "usage": None},
            {**text("Hi"), "usage": None},
            {**chunk({}, "stop"), "usage": None},
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [],
                "usage": USAGE,
            },
        ),
        "Hi",
        usage=USAGE,
    ),
    # Azure OpenAI: the first chunk has no choices, only prompt_filter_results; content chunks
    # carry content_filter_results; a last chunk with empty delta and the filter results.
    Shape(
        "azure",
        sse(
            {
                "choices": [],
                "created": 0,
                "id": "",
                "model": "",
                "object": "",
                "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": AZURE_FILTER}],
            },
            {
                **role(),
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                        "content_filter_results": {},
                    }
                ],
            },
            {
                **text("Bonjour"),
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": "Bonjour"},
                        "finish_reason": None,
                        "content_filter_results": AZURE_FILTER,
                    }
                ],
            },
            chunk({}, "stop"),
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {},
                        "finish_reason": None,
                        "content_filter_offsets": {"check_offset": 0, "start_offset": 0, "end_offset": 7},
                        "content_filter_results": AZURE_FILTER,
                    }
                ],
                "created": 0,
                "id": "",
                "model": "",
                "object": "",
            },
        ),
        "Bonjour",
    ),
    # OpenRouter: SSE comments (": OPENROUTER PROCESSING") before and between chunks.
    Shape(
        "openrouter-comments",
        sse(": OPENROUTER PROCESSING\n\n", role(), ": OPENROUTER PROCESSING\n\n", text("ok"), chunk({}, "stop")),
        "ok",
    ),
    # OpenRouter: the upstream's overload wrapped in an error object inside a 200 stream, before output.
    Shape(
        "openrouter-error-before",
        sse(
            ": OPENROUTER PROCESSING\n\n",
            {
                "error": {
                    "code": 502,
                    "message": "Provider returned error",
                    "metadata": {
                        "raw": '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
                        "provider_name": "Anthropic",
                    },
                }
            },
            done=False,
        ),
        kind=Kind.CAPACITY,
    ),
    # OpenRouter: an error chunk after output (it keeps "choices" with finish_reason "error").
    Shape(
        "openrouter-error-after",
        sse(
            role(),
            text("Half an ans"),
            {
                **chunk({"content": ""}, "error"),
                "provider": "openai",
                "error": {"code": "server_error", "message": "Provider disconnected unexpectedly"},
            },
            done=False,
        ),
        "Half an ans",
        kind=Kind.TRANSIENT,
        after_output=True,
    ),
    # Anthropic-style streams (and OpenAI-compatible proxies in front of Claude): event: error.
    Shape(
        "anthropic-event-error",
        sse(
            'event: ping\ndata: {"type": "ping"}\n\n',
            'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n',
            done=False,
        ),
        kind=Kind.CAPACITY,
    ),
    # Anthropic-style ping frames between chunks are normal traffic.
    Shape(
        "anthropic-ping",
        sse(role(), 'event: ping\ndata: {"type": "ping"}\n\n', text("pong"), chunk({}, "stop")),
        "pong",
    ),
    # Gemini's OpenAI-compatible endpoint: a 503 UNAVAILABLE as an error object in the stream
    # (it sends the error as a JSON list, as its native API does).
    Shape(
        "gemini-openai-error",
        sse(
            [
                {
                    "error": {
                        "code": 503,
                        "message": "The model is overloaded. Please try again later.",
                        "status": "UNAVAILABLE",
                    }
                }
            ],
            done=False,
        ),
        kind=Kind.CAPACITY,
    ),
    # Gemini's OpenAI-compatible endpoint: a 429 RESOURCE_EXHAUSTED per-minute quota as an object.
    Shape(
        "gemini-openai-429",
        sse(
            {
                "error": {
                    "code": 429,
                    "message": "Resource has been exhausted (e.g. check quota).",
                    "status": "RESOURCE_EXHAUSTED",
                }
            },
            done=False,
        ),
        kind=Kind.RATE_LIMITED,
    ),
    # vLLM: role-only first delta with content "", stop_reason beside finish_reason.
    Shape(
        "vllm",
        sse(
            role(),
            text("vllm says"),
            {
                **chunk({"content": ""}, "stop"),
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": ""},
                        "logprobs": None,
                        "finish_reason": "stop",
                        "stop_reason": None,
                    }
                ],
            },
        ),
        "vllm says",
    ),
    # vLLM: an error frame (its ErrorResponse) inside the stream.
    Shape(
        "vllm-error",
        sse(
            {
                "object": "error",
                "message": "The server is overloaded, please retry later.",
                "type": "ServiceUnavailableError",
                "param": None,
                "code": 503,
            },
            done=False,
        ),
        kind=Kind.CAPACITY,
    ),
    # Ollama's OpenAI compatibility: system_fingerprint fp_ollama, content null on the finish chunk.
    Shape(
        "ollama",
        sse(
            {**chunk({"role": "assistant", "content": "Hel"}), "system_fingerprint": "fp_ollama"},
            {**chunk({"role": "assistant", "content": "lo"}), "system_fingerprint": "fp_ollama"},
            {**chunk({"role": "assistant", "content": None}, "stop"), "system_fingerprint": "fp_ollama"},
        ),
        "Hello",
    ),
    # Ollama: a busy server refuses with an error object in the stream.
    Shape(
        "ollama-busy",
        sse(
            {
                "error": {
                    "message": "server busy, please try again.  maximum pending requests exceeded",
                    "type": "api_error",
                    "param": None,
                    "code": None,
                }
            },
            done=False,
        ),
        kind=Kind.CAPACITY,
    ),
    # OpenAI tool calls: id and name in the first delta, the arguments in pieces.
    Shape(
        "tool-call",
        sse(
            chunk(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ],
                }
            ),
            *[
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": WEATHER_ARGS[i : i + 7]}}]})
                for i in range(0, len(WEATHER_ARGS), 7)
            ],
            chunk({}, "tool_calls"),
        ),
        tool_calls=[
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER_ARGS}}
        ],
        finish="tool_calls",
    ),
    # Two parallel tool calls, their deltas interleaved by index.
    Shape(
        "parallel-tool-calls",
        sse(
            chunk(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "a", "arguments": ""}},
                        {"index": 1, "id": "call_b", "type": "function", "function": {"name": "b", "arguments": ""}},
                    ],
                }
            ),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"y"'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": 1}'}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": ": 2}"}}]}),
            chunk({}, "tool_calls"),
        ),
        tool_calls=[
            {"id": "call_a", "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
            {"id": "call_b", "type": "function", "function": {"name": "b", "arguments": '{"y": 2}'}},
        ],
        finish="tool_calls",
    ),
    # A connection that ends before any output: retryable, nothing reached the caller.
    Shape("cut-before-text", sse(role(), done=False), kind=Kind.TRANSIENT),
    # A connection that ends after text: the stream ends with an error, never as complete.
    Shape(
        "cut-after-text",
        sse(role(), text("Once upon"), done=False),
        "Once upon",
        kind=Kind.TRANSIENT,
        after_output=True,
    ),
    # Garbage before output.
    Shape("broken-before-text", b"data: {not json at all\n\n", kind=Kind.TRANSIENT),
    # Lines with CRLF endings, and frames with no blank line between them.
    Shape("crlf", sse(role(), text("crlf"), chunk({}, "stop"), sep="\r\n\r\n"), "crlf"),
    Shape("no-blank-lines", sse(role(), text("a"), text("b"), chunk({}, "stop"), sep="\n"), "ab"),
    # A stream that ends with a finish reason but no [DONE] (some compatible servers): complete.
    Shape("finish-without-done", sse(role(), text("fin"), chunk({}, "stop"), done=False), "fin"),
]


def openai_error(message: str, type_: str | None, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


_MAX_TOKENS = (
    "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
)

# (name, status, body, the token parameter that was refused)
UNSUPPORTED: list[tuple[str, int, Any, str]] = [
    # OpenAI o-series and gpt-5: the canonical shape.
    (
        "openai",
        400,
        openai_error(_MAX_TOKENS, "invalid_request_error", "max_tokens", "unsupported_parameter"),
        "max_tokens",
    ),
    # Azure OpenAI: the same error with an inner_error.
    (
        "azure",
        400,
        {
            "error": {
                "message": _MAX_TOKENS,
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "unsupported_parameter",
                "inner_error": None,
            }
        },
        "max_tokens",
    ),
    # OpenRouter passes the provider's message through in metadata.raw.
    (
        "openrouter",
        400,
        {
            "error": {
                "code": 400,
                "message": "Provider returned error",
                "metadata": {
                    "raw": json.dumps(
                        openai_error(_MAX_TOKENS, "invalid_request_error", "max_tokens", "unsupported_parameter")
                    ),
                    "provider_name": "OpenAI",
                },
            }
        },
        "max_tokens",
    ),
    # LiteLLM's proxy: its own wrapper around the provider's text.
    (
        "litellm",
        400,
        openai_error(f"litellm.BadRequestError: OpenAIException - {_MAX_TOKENS}", None, None, "400"),
        "max_tokens",
    ),
    # Older Azure API versions refuse the new parameter instead.
    (
        "azure-old",
        400,
        openai_error(
            "Unrecognized request argument supplied: max_completion_tokens", "invalid_request_error", None, None
        ),
        "max_completion_tokens",
    ),
    # vLLM validates the body with pydantic and forbids unknown fields.
    (
        "vllm",
        400,
        {
            "object": "error",
            "message": "[{'type': 'extra_forbidden', 'loc': ('body', "
            "'max_completion_tokens'), 'msg': 'Extra inputs are not permitted', "
            "'input': 512}]",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        "max_completion_tokens",
    ),
    # Mistral's API: a 422 naming the field.
    (
        "mistral",
        422,
        {
            "object": "error",
            "message": {
                "detail": [
                    {
                        "type": "extra_forbidden",
                        "loc": ["body", "max_completion_tokens"],
                        "msg": "Extra inputs are not permitted",
                        "input": 512,
                    }
                ]
            },
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        },
        "max_completion_tokens",
    ),
    # GitHub Models: code first, no type.
    (
        "github-models",
        400,
        {
            "error": {
                "code": "unsupported_parameter",
                "message": _MAX_TOKENS,
                "details": "Model gpt-5 does not support 'max_tokens'",
            }
        },
        "max_tokens",
    ),
]
