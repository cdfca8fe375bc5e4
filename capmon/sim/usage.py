"""How a simulated model reports the tokens it used: honestly, or as a broken or hostile
provider does (a model's ``usage`` in a scenario, or ``POST /admin/models/{name}``), so a
client can be shown to bound what it is told (capmon/core/providers/usage.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HONEST = "honest"
# "huge": 10^30 of each (beyond any int64); "negative": below zero; "float": half a token
# more; "string": the number as a string.
USAGE_MODES: tuple[str, ...] = (HONEST, "huge", "negative", "float", "string")
HUGE = 10**30


def _reported(n: int, mode: str) -> Any:
    if mode == "huge":
        return HUGE
    if mode == "negative":
        return -n - 1
    if mode == "float":
        return n + 0.5
    if mode == "string":
        return str(n)
    return n


def reported(counts: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """``counts`` (a usage object, its ``*_details`` objects included) as a model in ``mode`` reports them."""
    return {
        k: reported(v, mode) if isinstance(v, Mapping) else _reported(v, mode) if isinstance(v, int) else v
        for k, v in counts.items()
    }
