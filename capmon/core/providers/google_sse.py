"""Google's server-sent events (the Gemini API's and Vertex AI's ``?alt=sse`` streams).

A placeholder: the full reader (which also reads a raw ``{"error": ...}`` object sent
without a ``data:`` prefix) replaces this module."""

from __future__ import annotations

from capmon.core.providers.sse import SSEParser


class GoogleSSEParser(SSEParser):
    """Google's stream framing (placeholder: the plain server-sent events reader)."""
