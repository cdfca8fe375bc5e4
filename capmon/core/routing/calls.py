"""The client's calls in formats other than chat completions: the Responses API and
Anthropic's Messages. Each is a :class:`~capmon.core.types.result.Request` in its own
format, routed like any other; the answer comes back in that format whichever API
served it (capmon/core/providers/formats.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

from capmon.core.types.result import ChatResult, Request

if TYPE_CHECKING:
    from capmon.core.routing.streaming import ChatStream


class FormatCalls:
    """Mixed into the FallbackClient, whose ``chat`` and ``stream_chunks`` these use."""

    def chat(self, request: Any, **kw: Any) -> Awaitable[ChatResult]:
        raise NotImplementedError

    def stream_chunks(self, request: Any, **kw: Any) -> ChatStream:
        raise NotImplementedError

    def responses(self, body: Mapping[str, Any], **kw: Any) -> Awaitable[ChatResult]:
        """A Responses API request (``POST /v1/responses``), routed like a chat request;
        ``kw``: model, priority, deadline, item_id."""
        return self.chat(Request.responses(body, **kw))

    def stream_responses(self, body: Mapping[str, Any], **kw: Any) -> ChatStream:
        """A streaming Responses API request: the events, fallbacks before the first output."""
        return self.stream_chunks(Request.responses(body, **kw))

    def messages(self, body: Mapping[str, Any], **kw: Any) -> Awaitable[ChatResult]:
        """An Anthropic Messages request (``POST /v1/messages``), answered as a Messages
        response (``result.response``) whether an Anthropic- or an OpenAI-wire model served
        it (``result.api`` says which); ``kw``: model, priority, deadline, item_id."""
        return self.chat(Request.anthropic(body, **kw))

    def stream_messages(self, body: Mapping[str, Any], **kw: Any) -> ChatStream:
        """A streaming Messages request: Anthropic's events (``message_start`` ...
        ``message_stop``), fallbacks before the first output."""
        return self.stream_chunks(Request.anthropic(body, **kw))
