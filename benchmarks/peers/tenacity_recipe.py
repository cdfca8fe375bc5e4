"""Peer (c): the classic recipe: tenacity exponential backoff with jitter around "try
each model in order".

The openai cookbook's ``@retry(wait=wait_random_exponential(...), stop=...)`` with the
SDK's own retries off (``max_retries=0``), so tenacity is the only retry policy, around
a loop that tries every model in preference order and moves on at the first
retryable error. Waits are scaled to the scenarios' timescale exactly as capmon's are
(full jitter ``U(0, min(4, 0.25 * 2^n))``, the same as capmon's [backoff] base / cap
in the benchmark config), and it gives up after 120 s, capmon's deadline.
"""

from __future__ import annotations

from typing import Any

import openai
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from benchmarks.peers.base import Item, PeerContext

RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError)


class TenacityRecipe:
    def __init__(self, ctx: PeerContext) -> None:
        self.ctx = ctx
        self.client = openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
        self.rounds = 0

    async def __aenter__(self) -> TenacityRecipe:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def _each_model(self, item: Item) -> str:
        self.rounds += 1
        last: Exception | None = None
        for model in self.ctx.models:
            try:
                r = await self.client.chat.completions.create(model=model, messages=item.messages)
                return r.model
            except RETRYABLE as e:
                last = e
        assert last is not None
        raise last

    async def call(self, item: Item) -> str:
        async for attempt in AsyncRetrying(
            wait=wait_random_exponential(multiplier=0.25, max=4.0),
            stop=stop_after_delay(120.0),
            retry=retry_if_exception_type(RETRYABLE),
            reraise=True,
        ):
            with attempt:
                return await self._each_model(item)
        raise AssertionError("unreachable")

    def extra(self) -> dict[str, Any]:
        return {"rounds_over_the_model_list": self.rounds}


def make(ctx: PeerContext) -> TenacityRecipe:
    return TenacityRecipe(ctx)
