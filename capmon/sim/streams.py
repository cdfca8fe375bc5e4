"""Successful chat completion streams framed the way real providers frame them, and the
same streams broken on purpose (cut halfway, or ended by an in-stream error frame).

A model's ``stream_style`` picks the framing. Each style below says where its shape comes
from; they differ in what a client must not mistake for breakage: chunks with empty
``choices``, choices with no ``delta``, SSE comment lines, role-only or empty deltas,
``"content": null``, a finish reason on the last content chunk, usage in its own chunk.

Pure generators of SSE bytes, timed only by the injected clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from capmon.core.base.clock import Clock
from capmon.sim import dialects
from capmon.sim.model import Ticket
from capmon.sim.tools import ToolCall
from capmon.sim.usage import reported

STREAM_CHUNK_TOKENS = 4  # tokens per SSE chunk: realistic enough, far fewer events than one per token
TOOL_ARGUMENT_PIECE = 8  # characters of function.arguments per delta
FINGERPRINT = "fp_capmon_sim"
DONE = b"data: [DONE]\n\n"

_WORDS = (
    "The simulated provider answers with steady text so that a client can count tokens, check streams "
    "and compare replies. Capacity is finite: when every slot of a model is busy the next request is "
    "rejected at once, and a careful client backs off, waits for the hint, or falls back to another "
    "model that still has room. Batches keep going, breakers open and close, and the dashboard shows "
    "which model served every item."
).split()


RESULT_WORDS = 40  # words of a tool's result that an answer quotes


def answer_text(ticket: Ticket, tool_result: str | None = None) -> list[str]:
    """``completion_tokens`` words (one token each), starting somewhere different per request;
    after a tool's result, they start by quoting it (so a client sees its result was read).
    A structured answer is its JSON document, as one "word" (joined, it is the document)."""
    if ticket.structured is not None:
        return [structured_rest(ticket)]
    if ticket.resume is not None:
        rest = continued_words(ticket.resume, ticket.completion_tokens)
        if rest is not None:
            return rest
    start = ticket.id * 7 % len(_WORDS)
    words = [_WORDS[(start + i) % len(_WORDS)] for i in range(ticket.completion_tokens)]
    if tool_result is None:
        return words
    quoted = tool_result.split()[:RESULT_WORDS] or ["nothing."]
    return ["The", "tool", "returned:", *quoted, *words][: ticket.completion_tokens]


def continued_words(partial: str, total: int) -> list[str] | None:
    """The words that follow ``partial`` in the answer it began (of ``total`` words), when
    ``partial`` is the start of one of this simulator's answers (None: it is not)."""
    said = partial.split()
    n = len(_WORDS)
    if not said:
        return None
    for start in range(n):
        if all(_WORDS[(start + i) % n] == w for i, w in enumerate(said)):
            return [_WORDS[(start + len(said) + i) % n] for i in range(max(0, total - len(said)))]
    return None


def structured_rest(ticket: Ticket) -> str:
    """A structured answer's JSON document, or the rest of it when the request goes on from
    its beginning (a broken stream's continuation)."""
    assert ticket.structured is not None
    said = ticket.resume
    if said and ticket.structured.startswith(said):
        return ticket.structured[len(said) :]
    return ticket.structured


def _document_pieces(text: str, tokens: int) -> tuple[list[str], list[int]]:
    """A JSON document in as many pieces as prose of ``tokens`` tokens would stream (fewer
    when it is shorter), their tokens adding up to ``tokens``: usage and pacing stay the same."""
    count = max(1, min(math.ceil(tokens / STREAM_CHUNK_TOKENS), len(text)))
    size = max(1, math.ceil(len(text) / count))
    pieces = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    share, extra = divmod(tokens, len(pieces))
    return pieces, [share + (i < extra) for i in range(len(pieces))]


def answer_pieces(ticket: Ticket, tool_result: str | None = None) -> tuple[list[str], list[int]]:
    """The answer as stream pieces of ``STREAM_CHUNK_TOKENS`` words, and each piece's tokens
    (a continuation's first piece too starts with the space after the text it goes on from);
    a structured answer's document in pieces of characters."""
    if ticket.structured is not None:
        return _document_pieces(structured_rest(ticket), ticket.completion_tokens)
    words = answer_text(ticket, tool_result)
    groups = [words[i : i + STREAM_CHUNK_TOKENS] for i in range(0, len(words), STREAM_CHUNK_TOKENS)]
    lead = ticket.resume is not None and bool(ticket.resume) and not ticket.resume[-1].isspace()
    return [(" " if i or lead else "") + " ".join(g) for i, g in enumerate(groups)], [len(g) for g in groups]


def until_stop(pieces: list[str], costs: list[int], stops: tuple[str, ...]) -> tuple[list[str], list[int], bool]:
    """An answer's pieces (and their tokens) cut just before the first of ``stops`` it would
    say, and whether one was (the stop sequence itself is left out, as Gemini and Bedrock do)."""
    text = "".join(pieces)
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    if cut < 0:
        return pieces, costs, False
    kept: list[str] = []
    kept_costs: list[int] = []
    at = 0
    for piece, cost in zip(pieces, costs, strict=True):
        if at + len(piece) > cut:
            head = piece[: cut - at]
            if head:
                kept.append(head)
                kept_costs.append(len(head.split()))
            break
        kept.append(piece)
        kept_costs.append(cost)
        at += len(piece)
    return kept, kept_costs, True


def argument_pieces(arguments: str) -> list[str]:
    """A tool call's JSON arguments in pieces, as providers stream them (several, always)."""
    size = max(1, min(TOOL_ARGUMENT_PIECE, len(arguments) // 2))
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def tokens_of(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def usage(ticket: Ticket, completion_tokens: int) -> dict[str, Any]:
    """A chat answer's usage, as the ticket's model reports it (capmon/sim/usage.py)."""
    prompt_tokens = ticket.prompt_tokens
    counts = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    return reported(counts, ticket.usage)


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@dataclass(frozen=True)
class StreamPlan:
    """What one stream carries and how it ends."""

    ticket: Ticket
    created: int
    style: str = "openai"
    include_usage: bool = False
    tool_call: ToolCall | None = None
    tool_result: str | None = None  # the tool's result the answer quotes
    cut: bool = False  # stop halfway (or after ``cut_after`` content chunks): no finish_reason, no [DONE]
    cut_after: int = 0
    error_after: int | None = None  # this many content chunks, then the error frame
    error_dialect: str = dialects.OPENROUTER_STREAM


# ---------------------------------------------------------------- styles


class OpenAIFrames:
    """OpenAI's chat.completion.chunk: a role chunk (``content: ""`` and ``refusal: null``),
    content deltas, an empty delta with the finish reason, and with
    ``stream_options.include_usage`` ``"usage": null`` on every chunk and a last chunk with
    ``choices: []`` and the usage. Tool calls: the first delta has index, id, type and
    function.name with empty arguments (and ``content: null``), then function.arguments in
    pieces, then finish_reason "tool_calls" (platform.openai.com/docs/api-reference/chat-streaming)."""

    merge_finish = False  # the finish reason rides on its own chunk
    id_prefix = "chatcmpl-sim"

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self.envelope: dict[str, Any] = {
            "id": f"{self.id_prefix}{plan.ticket.id:010d}",
            "object": "chat.completion.chunk",
            "created": plan.created,
            "model": plan.ticket.model,
        }

    def chunk(self, delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
        payload = {
            **self.envelope,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.plan.include_usage:
            payload["usage"] = None
        return sse(payload)

    def prelude(self) -> bytes:
        return b""

    def opening(self, call: ToolCall | None) -> bytes:
        if call is None:
            return self.chunk({"role": "assistant", "content": "", "refusal": None})
        return self.chunk(
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {"index": 0, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
                ],
            }
        )

    def text(self, piece: str, finish: str | None = None) -> bytes:
        return self.chunk({"content": piece}, finish)

    def tool_pieces(self, call: ToolCall) -> list[str]:
        return argument_pieces(call.arguments)

    def tool_args(self, call: ToolCall, piece: str, finish: str | None = None) -> bytes:
        return self.chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, finish)

    def finish(self, reason: str) -> bytes:
        return self.chunk({}, reason)

    def between(self, emitted: int) -> bytes:
        return b""

    def epilogue(self, text_length: int) -> bytes:
        return b""

    def usage_chunk(self, used: dict[str, Any]) -> bytes:
        return sse({**self.envelope, "system_fingerprint": FINGERPRINT, "choices": [], "usage": used})


_SAFE = {"filtered": False, "severity": "safe"}
_FILTER_RESULTS = {"hate": _SAFE, "self_harm": _SAFE, "sexual": _SAFE, "violence": _SAFE}


class AzureFrames(OpenAIFrames):
    """Azure OpenAI: first a chunk with ``choices: []``, empty id / model / object and the
    ``prompt_filter_results``; every choice carries ``content_filter_results`` (``{}`` on the
    role and finish chunks); after the finish, an annotation chunk whose choice has no delta
    and ``content_filter_offsets`` (Asynchronous Filter). Sources: MicrosoftDocs/azure-ai-docs
    articles/ai-foundry/openai/concepts/content-streaming.md, and a recorded gpt-4o stream in
    dto-btn/ssc-assistant (mergeOpenAiDelta/testHelpers/simple_chat.ts)."""

    def chunk(
        self, delta: dict[str, Any] | None, finish: str | None = None, filters: dict[str, Any] | None = None
    ) -> bytes:
        payload = {
            "choices": [
                {
                    "content_filter_results": {} if filters is None else filters,
                    "delta": delta,
                    "finish_reason": finish,
                    "index": 0,
                    "logprobs": None,
                }
            ],
            **self.envelope,
            "system_fingerprint": FINGERPRINT,
        }
        if self.plan.include_usage:
            payload["usage"] = None
        return sse(payload)

    def _annotation(self, **extra: Any) -> dict[str, Any]:
        payload: dict[str, Any] = {"choices": [], "created": 0, "id": "", "model": "", "object": "", **extra}
        if self.plan.include_usage:
            payload["usage"] = None
        return payload

    def prelude(self) -> bytes:
        return sse(
            self._annotation(prompt_filter_results=[{"prompt_index": 0, "content_filter_results": _FILTER_RESULTS}])
        )

    def text(self, piece: str, finish: str | None = None) -> bytes:
        return self.chunk({"content": piece}, finish, _FILTER_RESULTS)

    def tool_args(self, call: ToolCall, piece: str, finish: str | None = None) -> bytes:
        return self.chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, finish, _FILTER_RESULTS)

    def epilogue(self, text_length: int) -> bytes:
        payload = self._annotation()
        payload["choices"] = [
            {
                "index": 0,
                "finish_reason": None,
                "content_filter_results": _FILTER_RESULTS,
                "content_filter_offsets": {"check_offset": text_length, "start_offset": 0, "end_offset": text_length},
            }
        ]
        return sse(payload)


class OpenRouterFrames(OpenAIFrames):
    """OpenRouter: SSE comment lines (``: OPENROUTER PROCESSING``) while it waits and between
    chunks, which a parser must skip (openrouter.ai/docs/api-reference/streaming); chunk ids
    ``gen-...``, a ``provider`` field, and ``native_finish_reason`` beside ``finish_reason``."""

    id_prefix = "gen-sim"
    comment_every = 3  # content chunks between two comment lines

    def chunk(self, delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
        payload = {
            **self.envelope,
            "provider": "Capmon",
            "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish, "native_finish_reason": finish, "logprobs": None}
            ],
        }
        return sse(payload)

    def opening(self, call: ToolCall | None) -> bytes:
        if call is None:
            return self.chunk({"role": "assistant", "content": ""})
        return super().opening(call)

    def prelude(self) -> bytes:
        return dialects.OPENROUTER_COMMENT

    def between(self, emitted: int) -> bytes:
        return dialects.OPENROUTER_COMMENT if emitted % self.comment_every == 0 else b""

    def usage_chunk(self, used: dict[str, Any]) -> bytes:
        return sse({**self.envelope, "provider": "Capmon", "choices": [], "usage": used})


class VllmFrames(OpenAIFrames):
    """vLLM (vllm/entrypoints/openai/serving_chat.py, chat_completion_stream_generator, chunks
    dumped with exclude_unset): no system_fingerprint and no usage key unless asked; a role
    chunk ``{"role": "assistant", "content": ""}``; the finish reason (with ``stop_reason``)
    rides on the last content chunk, not on a chunk of its own; the usage chunk has
    ``choices: []``. A named tool call streams id, type and name first, then arguments."""

    merge_finish = True

    def chunk(self, delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        return sse({**self.envelope, "choices": [choice]})

    def opening(self, call: ToolCall | None) -> bytes:
        head = self.chunk({"role": "assistant", "content": ""})
        if call is None:
            return head
        return head + self.chunk(
            {
                "tool_calls": [
                    {"id": call.id, "type": "function", "index": 0, "function": {"name": call.name, "arguments": ""}}
                ]
            }
        )

    def usage_chunk(self, used: dict[str, Any]) -> bytes:
        return sse({**self.envelope, "choices": [], "usage": used})


class OllamaFrames(OpenAIFrames):
    """Ollama's OpenAI compatibility (ollama/ollama openai/openai.go ToChunk, middleware/openai.go
    ChatWriter): ids ``chatcmpl-NNN``, system_fingerprint ``fp_ollama``, no logprobs; every
    delta carries ``role: "assistant"`` and a content string (no role-only chunk); the last
    chunk has ``content: ""`` and the finish reason; a tool call arrives whole in one delta;
    the usage chunk is the last chunk again with ``choices: []``."""

    def __init__(self, plan: StreamPlan) -> None:
        super().__init__(plan)
        self.envelope["id"] = f"chatcmpl-{plan.ticket.id % 1000}"

    def chunk(self, delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
        return sse(
            {
                **self.envelope,
                "system_fingerprint": "fp_ollama",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    def opening(self, call: ToolCall | None) -> bytes:
        return b""

    def text(self, piece: str, finish: str | None = None) -> bytes:
        return self.chunk({"role": "assistant", "content": piece}, finish)

    def tool_pieces(self, call: ToolCall) -> list[str]:
        return [call.arguments]

    def tool_args(self, call: ToolCall, piece: str, finish: str | None = None) -> bytes:
        return self.chunk(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": call.id, "index": 0, "type": "function", "function": {"name": call.name, "arguments": piece}}
                ],
            },
            finish,
        )

    def finish(self, reason: str) -> bytes:
        return self.chunk({"role": "assistant", "content": ""}, reason)

    def usage_chunk(self, used: dict[str, Any]) -> bytes:
        return sse({**self.envelope, "system_fingerprint": "fp_ollama", "choices": [], "usage": used})


STYLES: dict[str, type[OpenAIFrames]] = {
    "openai": OpenAIFrames,
    "azure": AzureFrames,
    "openrouter": OpenRouterFrames,
    "vllm": VllmFrames,
    "ollama": OllamaFrames,
}


def frames_for(plan: StreamPlan) -> OpenAIFrames:
    return STYLES[plan.style](plan)


# ---------------------------------------------------------------- the stream


async def chat_stream(clock: Clock, plan: StreamPlan) -> AsyncIterator[bytes]:
    """The whole stream for one admitted (or faulted) request."""
    frames = frames_for(plan)
    ticket, call = plan.ticket, plan.tool_call
    prelude = frames.prelude()
    if prelude:
        yield prelude  # sent while the model "thinks": before the first token
    await clock.sleep(ticket.first_token)
    if call is None:
        pieces, costs = answer_pieces(ticket, plan.tool_result)  # one token per word
        reason, completion = ticket.finish_reason, ticket.completion_tokens
    else:
        pieces = frames.tool_pieces(call)
        costs = [tokens_of(p) for p in pieces]
        reason, completion = "tool_calls", tokens_of(call.arguments)

    def error(emitted: int) -> bytes:
        return dialects.chat_stream_error(
            plan.error_dialect, model=ticket.model, chunk=frames.envelope if emitted else None
        )

    if plan.error_after == 0:
        yield error(0)  # before any output: not even the role chunk
        return
    opening = frames.opening(call)
    if opening:
        yield opening
    emitted = 0
    for i, piece in enumerate(pieces):
        if plan.cut and i >= (plan.cut_after or len(pieces) // 2):
            return  # the stream just stops: no finish_reason, no [DONE]
        await clock.sleep(ticket.per_token * costs[i])
        finish = reason if frames.merge_finish and i == len(pieces) - 1 and plan.error_after is None else None
        yield frames.text(piece, finish) if call is None else frames.tool_args(call, piece, finish)
        emitted += 1
        if plan.error_after is not None and emitted >= plan.error_after:
            yield error(emitted)
            return
        between = frames.between(emitted)
        if between:
            yield between
    if plan.error_after is not None:
        yield error(emitted)  # asked for more chunks than the answer has: the error comes last
        return
    if not frames.merge_finish:
        yield frames.finish(reason)
    epilogue = frames.epilogue(sum(len(p) for p in pieces))
    if epilogue:
        yield epilogue
    if plan.include_usage:
        yield frames.usage_chunk(usage(ticket, completion))
    yield DONE


async def rejection_stream(dialect: str, model: str) -> AsyncIterator[bytes]:
    """A 200 stream whose only content is a capacity rejection in ``dialect``."""
    yield dialects.chat_stream_error(dialect, model=model, chunk=None)
