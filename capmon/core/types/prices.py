"""What a model's tokens cost, and what one answer cost.

Prices come from one place, :func:`price_of`: the config's (``[[models]] prices``, a
deployment's own ``prices`` winning for the target that serves there), else the offline
catalogue's for the id its endpoint knows the model by (capmon/core/types/catalogue.py:
models.dev's data, shipped with the package). A model without
a price has no cost: None, never a guessed number, so a sum over answers says how many it
could not price rather than counting them as free.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from capmon.core.base.schema import spec as _f
from capmon.core.types import canon

if TYPE_CHECKING:
    from capmon.core.types.config import EndpointApi, ModelConfig

PER = 1_000_000  # prices are per million tokens, as every provider's price list gives them


@dataclass(frozen=True)
class Prices:
    """USD per million tokens (``prices = { input = 3.0, output = 15.0, cached_input = 0.3 }``)."""

    input: float = _f(
        missing="missing; expected USD per million input tokens", min=0, doc="USD per million input tokens"
    )
    output: float = _f(
        missing="missing; expected USD per million output tokens", min=0, doc="USD per million output tokens"
    )
    cached_input: float | None = _f(
        None,
        min=0,
        doc=(
            "USD per million input tokens read from the provider's prompt cache; not set: the input price"
            " (a cache write is priced as input)"
        ),
    )


@dataclass(frozen=True, slots=True)
class Tokens:
    """One answer's token counts as they are priced."""

    input: int  # every input token, the cached ones and cache writes included
    cached: int  # the part of ``input`` read from a cache
    output: int  # reasoning included: every provider bills it as output

    @staticmethod
    def of(usage: canon.Usage | None) -> Tokens | None:
        """The counts of a usage (None: the answer told none)."""
        if usage is None or (usage.input is None and usage.output is None):
            return None
        cached = usage.cache_read or 0
        return Tokens(input=usage.prompt, cached=cached, output=usage.output or 0)


def price_of(model: ModelConfig, api: EndpointApi | None = None) -> Prices | None:
    """The prices of ``model`` as the target that carries it sees them (a deployment's own
    prices are already on it: ``ModelConfig.at``), else the catalogue's for its id at an
    ``api`` endpoint; None: nobody says."""
    if model.prices is not None or api is None:
        return model.prices
    return _listed(api, model.wire_name)


@functools.cache
def _listed(api: EndpointApi, model_id: str) -> Prices | None:
    """The catalogue's prices of ``model_id`` at an ``api`` endpoint, read once (every answer
    is priced)."""
    from capmon.core.types import catalogue  # its data is read on the first lookup

    found = catalogue.model(api, model_id)
    cost = found.cost if found is not None else None
    if cost is None or cost.input is None or cost.output is None:
        return None
    return Prices(input=float(cost.input), output=float(cost.output), cached_input=cost.cache_read)


def cost_of(prices: Prices | None, tokens: Tokens | None) -> float | None:
    """USD for ``tokens`` at ``prices``; None when either is unknown."""
    if prices is None or tokens is None:
        return None
    cached_price = prices.input if prices.cached_input is None else prices.cached_input
    fresh = max(0, tokens.input - tokens.cached)
    return (fresh * prices.input + tokens.cached * cached_price + tokens.output * prices.output) / PER
