"""What a batch job needs of a client: the shared FallbackClient has it all, and a test's
stand-in needs no more than this."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from capmon.core.base.clock import Clock
from capmon.core.types.config import Config
from capmon.core.types.events import EventBus
from capmon.core.types.result import Attempt, ChatResult, Request

AttemptObserver = Callable[[Request, Attempt], None]


class BatchClient(Protocol):
    @property
    def config(self) -> Config:
        """Read for ``client.max_response_bytes`` and each model's max_tokens."""
        ...

    @property
    def clock(self) -> Clock: ...

    @property
    def bus(self) -> EventBus: ...

    def model_names(self) -> list[str]:
        """The models items may name (the config's, in preference order)."""
        ...

    def add_observer(self, fn: AttemptObserver) -> Callable[[], None]:
        """Call ``fn(request, attempt)`` after every attempt; returns the detach function."""
        ...

    async def chat(self, request: Request) -> ChatResult: ...
