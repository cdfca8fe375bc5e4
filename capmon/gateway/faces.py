"""The face the gateway shows the callers of each API it speaks: which paths are that API's,
how its errors are shaped, and how its streams are framed. One :class:`Face` per caller
format (the OpenAI APIs' chat completions and Responses, Anthropic's Messages, Google's
generateContent, Bedrock's Converse), so nothing else in the gateway asks which API a request came in on:
a reply takes its request's face (:data:`FACES`), an error answered before a request is
read takes its path's (:func:`face_of_path`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from capmon.core.types.failure import Kind
from capmon.core.types.result import Format
from capmon.gateway import sse
from capmon.gateway.anthropic_errors import AnthropicError, on_messages_path
from capmon.gateway.bedrock_errors import BedrockError
from capmon.gateway.errors import ApiError, Shaper
from capmon.gateway.gemini_errors import GeminiError


def _openai(err: ApiError, failure_kind: Kind | None = None) -> ApiError:
    return err


def vertex_publisher(path: str) -> str | None:
    """The publisher of a Vertex AI path (``/v1/projects/P/locations/L/publishers/google/...``:
    ``google``), or None for any other path."""
    parts = path.split("/", 8)
    if len(parts) > 7 and parts[2] == "projects" and parts[4] == "locations" and parts[6] == "publishers":
        return parts[7]
    return None


def on_gemini_path(path: str) -> bool:
    """Whether a path is one of Google's generateContent routes (``/v1beta/models/...``,
    ``/v1/models/{model}:...``, Vertex's Gemini models): its errors are then Google's.
    ``/v1/models`` and ``/v1/models/{name}`` without a method are the OpenAI API's list and get."""
    if path.startswith("/v1beta/models"):
        return True
    if path.startswith("/v1/models/"):
        return ":" in path.rpartition("/")[2]
    return vertex_publisher(path) == "google"


def on_bedrock_path(path: str) -> bool:
    """Whether a path is Bedrock's runtime API (``/model/{modelId}/converse``...): its errors
    are then Bedrock's."""
    return path.startswith("/model/")


def on_claude_path(path: str) -> bool:
    """Whether a path is Anthropic's API: ``/v1/messages...``, or Claude on Vertex's paths."""
    return on_messages_path(path) or vertex_publisher(path) == "anthropic"


@dataclass(frozen=True, slots=True)
class Face:
    """What callers of one API see of the gateway."""

    api: str  # the metrics' and the access log's ``api`` label
    owns: Callable[[str], bool]  # whether a path is this API's
    shaped: Shaper  # an error in this API's shape
    framing: Callable[[], sse.Framing]  # a new stream's framing


CHAT = Face("chat", lambda path: path.startswith("/v1/chat/"), _openai, sse.ChatFraming)
RESPONSES = Face("responses", lambda path: path.startswith("/v1/responses"), _openai, sse.ResponsesFraming)
MESSAGES = Face("messages", on_claude_path, AnthropicError.of, sse.MessagesFraming)
GEMINI = Face("gemini", on_gemini_path, GeminiError.of, sse.GeminiFraming)
CONVERSE = Face("converse", on_bedrock_path, BedrockError.of, sse.EventStreamFraming)

FACES: Mapping[Format, Face] = {
    Format.CHAT: CHAT,
    Format.RESPONSES: RESPONSES,
    Format.MESSAGES: MESSAGES,
    Format.GEMINI: GEMINI,
    Format.CONVERSE: CONVERSE,
}


def face_of_path(path: str) -> Face | None:
    """The API a path belongs to, or None (the gateway's own routes: OpenAI's shapes)."""
    for face in FACES.values():
        if face.owns(path):
            return face
    return None


def shaped_for(path: str, err: ApiError) -> ApiError:
    """``err`` in the shape of the API that ``path`` belongs to."""
    face = face_of_path(path)
    return err if face is None else face.shaped(err, None)
