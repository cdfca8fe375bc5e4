"""A stream of chunks (chat completions) or events (the Responses API, Anthropic's
Messages), in the caller's format,
with what the client knows about it as it goes: which request it is, which model and
target serve it once output has started, the attempts before, and the result at the
end. The gateway reads these to write its response headers before the first byte."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from capmon.core.providers.formats import chunk_text
from capmon.core.types.config import EndpointApi
from capmon.core.types.result import Attempt, ChatResult, Continued, Format, fallbacks, sent, skipped


class ChatStream:
    def __init__(self, run: Callable[[ChatStream], AsyncIterator[Mapping[str, Any]]], caller: Format) -> None:
        self.caller = caller  # the request's format: the chunks' own
        self.request_id = 0
        self.requested = ""  # the model the request counted on first (ChatResult.requested)
        self.model: str | None = None  # set when the first chunk is out
        self.endpoint: str | None = None
        self.deployment: str | None = None  # the id the serving endpoint knows the model by
        self.target: str | None = None
        self.attempts: tuple[Attempt, ...] = ()  # the failed attempts (and skips) before the one streaming
        self.api: EndpointApi | None = None  # the API of the endpoint that serves it
        self.dropped: tuple[str, ...] = ()  # fields the serving attempt left out (its API version refuses them)
        self.max_tokens_lowered: int | None = None  # the output cap sent when [client] cap_client_tokens cut it
        self.result: ChatResult | None = None  # set when the stream has ended complete
        self.continuations: list[Continued] = []  # filled as the stream is continued (the client's)
        self._chunks = run(self)

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> Mapping[str, Any]:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        """Stop early: the attempt is cancelled and its slot given back."""
        await self._chunks.aclose()  # type: ignore[attr-defined]

    def serving(
        self,
        model: str,
        endpoint: str,
        target: str,
        attempts: tuple[Attempt, ...],
        *,
        api: EndpointApi | None = None,
        dropped: tuple[str, ...] = (),
        lowered: int | None = None,
        deployment: str | None = None,
    ) -> None:
        """Output has started: who serves it (the model, the endpoint and the id it knows the
        model by), after which failed attempts."""
        self.model, self.endpoint, self.target, self.attempts = model, endpoint, target, attempts
        self.deployment = deployment
        self.api, self.dropped, self.max_tokens_lowered = api, dropped, lowered

    async def texts(self) -> AsyncIterator[str]:
        """The answer's text as it comes (in any format), the chunks read and dropped."""
        try:
            async for chunk in self:
                text = chunk_text(self.caller, chunk)
                if text:
                    yield text
        finally:
            await self.aclose()

    @property
    def continued(self) -> tuple[Continued, ...]:
        """Who went on with the answer after it broke, and from which character (so far; empty:
        it never broke). See capmon/core/routing/continuation.py."""
        return tuple(self.continuations)

    @property
    def skipped(self) -> list[Attempt]:
        """The targets it passed over before the one streaming, each with why."""
        return skipped(self.attempts)

    @property
    def fallbacks(self) -> int:
        models = [a.model for a in sent(self.attempts)] + ([self.model] if self.model else [])
        return fallbacks(self.requested if self.model else "", models)
