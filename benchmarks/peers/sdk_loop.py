"""Peer (b): the openai SDK with a hand-written loop over the model list.

What a developer writes after the first "Selected model is at capacity": keep the SDK's
default retries (max_retries=2 on each model) and, when a model still fails with a
capacity, rate-limit, server or connection error, try the next model in preference
order. An item that fails on every model counts as not completed.
"""

from __future__ import annotations

from typing import Any

import openai

from benchmarks.peers.base import Item, PeerContext

RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError)


class SdkLoop:
    def __init__(self, ctx: PeerContext) -> None:
        self.ctx = ctx
        self.client = openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key)  # max_retries=2
        self.fallbacks = 0

    async def __aenter__(self) -> SdkLoop:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def call(self, item: Item) -> str:
        last: Exception | None = None
        for i, model in enumerate(self.ctx.models):
            try:
                r = await self.client.chat.completions.create(model=model, messages=item.messages)
                if i:
                    self.fallbacks += 1
                return r.model
            except RETRYABLE as e:
                last = e
        assert last is not None
        raise last

    def extra(self) -> dict[str, Any]:
        return {"fell_back": self.fallbacks}


def make(ctx: PeerContext) -> SdkLoop:
    return SdkLoop(ctx)
