"""The clients compared by the benchmark, one module each.

Every peer module defines ``make(ctx: PeerContext) -> Peer``: an async context manager
whose ``call(item)`` sends one item and returns the name of the model that served it
(raising on failure). ``benchmarks.peers.base.run_peer`` drives it with the same number
of workers over the same items for every peer; ``python -m benchmarks.peers`` runs one
peer in its own process (the runner does that, so peers never share a process, an
event loop, a connection pool or module-level state such as LiteLLM's caches).
"""

from __future__ import annotations

PEERS: dict[str, str] = {
    # name -> (module under benchmarks.peers); the order is the table's order.
    "sdk-default": "sdk_default",
    "sdk-loop": "sdk_loop",
    "tenacity": "tenacity_recipe",
    "litellm": "litellm_router",
    "capmon": "capmon_client",
    "capmon-gateway": "capmon_gateway",
}

# Run only when named (--peers): the gateway is capmon itself, priced against the library,
# not one more alternative in the default comparison.
OPTIONAL: frozenset[str] = frozenset({"capmon-gateway"})

DESCRIPTIONS: dict[str, str] = {
    "sdk-default": "openai SDK, default retries (max_retries=2), the preferred model only",
    "sdk-loop": "openai SDK, default retries, hand-written loop over the model list",
    "tenacity": "tenacity full-jitter exponential backoff around 'try each model in order' (SDK max_retries=0)",
    "litellm": "LiteLLM Router: fallbacks flagship -> medium -> small, retries, cooldowns",
    "capmon": "capmon FallbackClient with benchmarks/capmon-bench.toml",
    "capmon-gateway": "openai SDK (max_retries=0, model auto) through `capmon serve` on benchmarks/capmon-bench.toml",
}
