"""Peer (a): the openai SDK as most code uses it: one model, the SDK's default retries.

``AsyncOpenAI(max_retries=2)`` retries 408 / 409 / 429 / 5xx twice, waiting
``0.5 * 2^n`` seconds minus up to 25 % (or exactly the server's Retry-After when there
is one). An item that still fails after that counts as not completed.
"""

from __future__ import annotations

from typing import Any

import openai

from benchmarks.peers.base import Item, PeerContext


class SdkDefault:
    def __init__(self, ctx: PeerContext) -> None:
        self.ctx = ctx
        self.model = ctx.models[0]
        self.client = openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key)  # max_retries=2

    async def __aenter__(self) -> SdkDefault:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def call(self, item: Item) -> str:
        r = await self.client.chat.completions.create(model=self.model, messages=item.messages)
        return r.model

    def extra(self) -> dict[str, Any]:
        return {}


def make(ctx: PeerContext) -> SdkDefault:
    return SdkDefault(ctx)
