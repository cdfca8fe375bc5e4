"""The responses format: OpenAI's Responses API (/responses). Its requests, answers and stream events to and from the
canonical hub (capmon/core/types/canon.py), and what reads and probes it. A module of
:class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md, "Across formats"."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from capmon.core.providers import openai_wire as wire
from capmon.core.providers.classify import QUOTA_HINT, classify_event, classify_response
from capmon.core.providers.openai_wire import Event, TokenParam
from capmon.core.providers.sse import Frame
from capmon.core.types.failure import Failure, Kind

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.
#
#
#
# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.
#
#
#
# ================================================================ reading and probing
# the answer and frames as the wire sends them, usage, text, the probe body, the error shape.
#
#
#


def parse(status: int, body: bytes) -> Mapping[str, Any] | None:
    """A plain answer (a completed or incomplete response), or None."""
    return wire.parse_response(status, body)


def unfinished(status: int, headers: Any, body: bytes, *, now: float, quota_hint: float) -> Failure:
    """A 2xx that is no finished response: a failed one says why, like its stream would."""
    try:
        obj = json.loads(body)
    except Exception:
        obj = None
    if isinstance(obj, Mapping) and obj.get("object") == "response" and obj.get("status") == "failed":
        return classify_event(
            {"type": "response.failed", "response": obj}, "response.failed", now=now, quota_hint=quota_hint
        )
    failure = classify_response(status, headers, body, now=now, quota_hint=quota_hint)
    return failure or Failure(Kind.TRANSIENT, f"{status} with no finished response", status)


def text(response: Mapping[str, Any]) -> str:
    """The answer's text: its output_text parts, in order."""
    return wire.response_text(response)


def used_tokens(response: Mapping[str, Any] | None) -> int | None:
    """The tokens the answer says it used (``usage.total_tokens``)."""
    return wire.total_tokens(response)


def chunk_text(chunk: Mapping[str, Any]) -> str:
    """The text a stream event adds (``response.output_text.delta``; "" when none)."""
    delta = chunk.get("delta") if chunk.get("type") == "response.output_text.delta" else None
    return delta if isinstance(delta, str) else ""


def probe_body(model: str, token_param: TokenParam) -> dict[str, Any]:
    """The smallest Responses request: one token of output is too few for the API (its
    floor is 16), so the probe asks for that floor."""
    return wire.responses_body({"input": "ping"}, model=model, max_output_tokens=16, stream=False)


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one frame of a Responses stream is. Never raises."""
    return wire.read_responses_frame(frame, now=now, quota_hint=quota_hint)


class Assembled:
    """A Responses stream's answer: the response its last event (``response.completed``) carries."""

    finished = False  # whole only at that last event, which the attempt sees

    def __init__(self) -> None:
        self._final: Mapping[str, Any] | None = None

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        if done:
            final = chunk.get("response")
            self._final = final if isinstance(final, Mapping) else None

    def answer(self) -> Mapping[str, Any] | None:
        return self._final


def assembler() -> Assembled:
    return Assembled()
