"""Peer (d): LiteLLM's Router with fallbacks and cooldowns (the optional ``bench`` extra).

One deployment per model, ``fallbacks`` in preference order, ``num_retries=2`` (the
SDK's default count) and cooldowns scaled to the scenarios' timescale like capmon's:
a deployment that fails ``allowed_fails`` times is cooled down for ``cooldown_time``
seconds (1 s, capmon's first breaker cool-down in the benchmark config). The inner
provider call has ``max_retries=0`` so the Router is the only retry policy.

LiteLLM is imported only here, with its model cost map read locally (no network).
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.peers.base import Item, PeerContext

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_LOG", "ERROR")

COOLDOWN = 1.0
ALLOWED_FAILS = 3
NUM_RETRIES = 2


class LiteLLMRouter:
    def __init__(self, ctx: PeerContext) -> None:
        import litellm
        from litellm import Router

        litellm.telemetry = False
        litellm.suppress_debug_info = True
        self.ctx = ctx
        model_list = [
            {
                "model_name": m,
                "litellm_params": {
                    "model": f"openai/{m}",
                    "api_base": ctx.base_url,
                    "api_key": ctx.api_key,
                    "max_retries": 0,
                },
            }
            for m in ctx.models
        ]
        first, rest = ctx.models[0], list(ctx.models[1:])
        self.router = Router(
            model_list=model_list,
            fallbacks=[{first: rest}] if rest else [],
            num_retries=ctx.options.get("litellm_num_retries", NUM_RETRIES),
            allowed_fails=ctx.options.get("litellm_allowed_fails", ALLOWED_FAILS),
            cooldown_time=ctx.options.get("litellm_cooldown", COOLDOWN),
            timeout=60.0,
        )
        self.served_unknown = 0

    async def __aenter__(self) -> LiteLLMRouter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def call(self, item: Item) -> str:
        r = await self.router.acompletion(model=self.ctx.models[0], messages=item.messages)
        model = getattr(r, "model", None) or ""
        for m in self.ctx.models:  # LiteLLM may report "openai/sim-medium" or the group name
            if model == m or model.endswith("/" + m):
                return m
        hidden = getattr(r, "_hidden_params", {}) or {}
        group = hidden.get("model_group") or ""
        if group in self.ctx.models:
            return group
        self.served_unknown += 1
        return model or "?"

    def extra(self) -> dict[str, Any]:
        import litellm

        return {
            "litellm_version": getattr(litellm, "version", None) or _version(),
            "served_unknown": self.served_unknown,
        }


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("litellm")
    except Exception:
        return "?"


def make(ctx: PeerContext) -> LiteLLMRouter:
    return LiteLLMRouter(ctx)
