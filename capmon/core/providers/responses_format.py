"""The responses format: OpenAI's Responses API (/responses). Its requests, answers and stream events to and from the
canonical hub (capmon/core/types/canon.py), and what reads and probes it. A module of
:class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md, "Across formats"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capmon.core.providers import hub
from capmon.core.types import canon

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.
#
#
#
# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.

_NOT_READ = (
    "a Responses {} is read only by a Responses caller, which gets it untouched "
    "(no caller of another format is ever served by a Responses wire)"
)


def decode_answer(answer: Mapping[str, Any]) -> canon.Answer:
    raise hub.Incapable(_NOT_READ.format("answer"))


def stream_decoder() -> hub.StreamDecoder:
    raise hub.Incapable(_NOT_READ.format("stream"))


def encode_usage(usage: canon.Usage | None) -> dict[str, Any]:
    """The hub's usage as the Responses API's: ``input_tokens`` is fresh input, cache writes
    and cache reads together, the cached part in ``input_tokens_details``."""
    u = usage or canon.Usage()
    prompt, output = u.prompt, u.output or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": u.cache_read or 0, "cache_write_tokens": u.cache_write or 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning or 0},
        "total_tokens": prompt + output,
    }


# Stop reasons that leave a response incomplete, and why (any other completes it).
INCOMPLETE: Mapping[canon.Stop, str] = {
    canon.Stop.MAX_TOKENS: "max_output_tokens",
    canon.Stop.CONTEXT_WINDOW: "max_output_tokens",
    canon.Stop.REFUSAL: "content_filter",
}


def _text_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(item_id: str, call: canon.ToolCall, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _response(
    head: Mapping[str, Any], output: list[dict[str, Any]], stop: canon.Stop | None, usage: canon.Usage | None
) -> dict[str, Any]:
    reason = None if stop is None else INCOMPLETE.get(stop)
    return {
        **head,
        "object": "response",
        "status": "completed" if reason is None else "incomplete",
        "incomplete_details": None if reason is None else {"reason": reason},
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": encode_usage(usage) if usage is not None else None,
    }


def encode_answer(answer: canon.Answer, *, created: int) -> dict[str, Any]:
    """The hub's answer as a Responses API answer: an output message item per text part and
    a function call item per tool call, each item's id the answer's and the part's index
    (every part counts, thinking too); thinking left out, as in chat."""
    output: list[dict[str, Any]] = []
    for n, part in enumerate(answer.parts):
        if isinstance(part, canon.Text):
            output.append(_text_item(f"{answer.id}_{n}", part.text, "completed"))
        elif isinstance(part, canon.ToolCall):
            output.append(_call_item(f"{answer.id}_{n}", part, part.arguments, "completed"))
    head = {"id": answer.id, "created_at": created, "model": answer.model}
    return _response(head, output, answer.stop, answer.usage or canon.Usage())


class _Encoder:
    """The hub's events in, Responses events out: ``response.created`` and
    ``response.in_progress``; per text part an output message item with its
    ``output_text`` deltas; per tool call a ``function_call`` item with its argument
    deltas; then ``response.completed`` (or ``response.incomplete``) carrying the whole
    answer. Thinking is left out, as in answers."""

    def __init__(self, *, created: int) -> None:
        self.created = created
        self.head: dict[str, Any] = {"id": "", "created_at": created, "model": ""}
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._open: dict[int, tuple[int, dict[str, Any], list[str]]] = {}  # part -> (output index, item, pieces)
        self.stop: canon.Stop | None = None
        self.usage = canon.Usage()

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def feed(self, event: canon.Event) -> list[dict[str, Any]]:
        if isinstance(event, canon.Started):
            self.head.update(id=event.id, model=event.model)
            self.usage = self.usage.merged(event.usage or canon.Usage())
            skeleton = {**_response(self.head, [], None, None), "status": "in_progress"}
            return [
                self._event("response.created", response=skeleton),
                self._event("response.in_progress", response=skeleton),
            ]
        if isinstance(event, canon.PartStarted):
            return self._start(event.index, event.part)
        if isinstance(event, canon.PartDelta):
            return self._delta(event)
        if isinstance(event, canon.PartStopped):
            return self._stop(event.index)
        if isinstance(event, canon.Ended):
            self.stop = event.stop
            self.usage = self.usage.merged(event.usage or canon.Usage())
            return []
        if isinstance(event, canon.Done):
            response = _response(self.head, self.output, self.stop, self.usage)
            done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            return [self._event(done, response=response)]
        return []

    def _start(self, index: int, part: canon.Part) -> list[dict[str, Any]]:
        n = len(self.output)
        item_id = f"{self.head['id']}_{index}"
        if isinstance(part, canon.Text):
            item = {**_text_item(item_id, "", "in_progress"), "content": []}
            self._open[index] = (n, item, [])
            self.output.append(item)
            text = {"type": "output_text", "text": "", "annotations": []}
            return [
                self._event("response.output_item.added", output_index=n, item=dict(item)),
                self._event("response.content_part.added", item_id=item_id, output_index=n, content_index=0, part=text),
            ]
        if isinstance(part, canon.ToolCall):
            item = _call_item(item_id, part, "", "in_progress")
            self._open[index] = (n, item, [])
            self.output.append(item)
            return [self._event("response.output_item.added", output_index=n, item=dict(item))]
        return []

    def _delta(self, event: canon.PartDelta) -> list[dict[str, Any]]:
        opened = self._open.get(event.index)
        if opened is None:
            return []
        n, item, pieces = opened
        piece = event.text if event.text is not None else event.arguments
        if not piece:
            return []
        pieces.append(piece)
        if item["type"] == "message":
            return [
                self._event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=n,
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                )
            ]
        return [self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=n, delta=piece)]

    def _stop(self, index: int) -> list[dict[str, Any]]:
        opened = self._open.pop(index, None)
        if opened is None:
            return []
        n, item, pieces = opened
        whole = "".join(pieces)
        if item["type"] == "message":
            done = _text_item(item["id"], whole, "completed")
            self.output[n] = done
            part = done["content"][0]
            return [
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=n,
                    content_index=0,
                    text=whole,
                    logprobs=[],
                ),
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=n, content_index=0, part=part
                ),
                self._event("response.output_item.done", output_index=n, item=done),
            ]
        done = {**item, "arguments": whole, "status": "completed"}
        self.output[n] = done
        return [
            self._event("response.function_call_arguments.done", item_id=item["id"], output_index=n, arguments=whole),
            self._event("response.output_item.done", output_index=n, item=done),
        ]


def stream_encoder(*, created: int, include_usage: bool) -> hub.StreamEncoder:
    """``include_usage``: a Responses stream's last event always carries the whole answer, usage too."""
    return _Encoder(created=created)


# ================================================================ reading and probing
# the answer and frames as the wire sends them, usage, text, the probe body, the error shape.
#
#
#
