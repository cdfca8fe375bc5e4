"""Which features a request needs and whether a target's model has them.

What a request needs is read from its body in any format, decoded once through the hub
(:data:`~capmon.core.providers.hub.FORMATS`): its tools, a schema or JSON mode for its
answer, images in its messages, its reasoning settings. What a model has is, in order: the
config (the deployment's ``capabilities``, else the model's), what a provider's 400 taught
this process or its fleet (:class:`~capmon.core.types.capability.Lessons`, kept by the
state), the catalogue (capmon/core/types/catalogue.py), else it is assumed capable.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from capmon.core.base.exceptions import CapmonError
from capmon.core.providers import hub
from capmon.core.types import canon, catalogue
from capmon.core.types.capability import Feature, Lessons, Source
from capmon.core.types.config import EndpointApi, ModelConfig
from capmon.core.types.result import Format, Request

if TYPE_CHECKING:
    from capmon.core.routing.targets import Target

# Own fields of a source format that ask for a JSON answer, or set reasoning, and that no
# canonical slot holds (chat's json_object mode, Gemini's mime type, its thinkingConfig).
_JSON_MODE = ("response_format", "text.format", "generationConfig.responseMimeType")
# Chat's legacy function calling (before ``tools``): functions to call need a model with tools.
_FUNCTIONS = ("functions", "function_call")
_REASONING = ("reasoning_effort", "reasoning", "generationConfig.thinkingConfig")


def _json_mode(own: Mapping[str, Any]) -> bool:
    for name in _JSON_MODE:
        value = own.get(name)
        if isinstance(value, Mapping) and str(value.get("type", "")).startswith("json"):
            return True
        if isinstance(value, str) and value.endswith("json"):
            return True
    return False


def _reasons(request: canon.Request) -> bool:
    if request.effort is not None:
        return True
    if isinstance(request.thinking, Mapping) and request.thinking.get("type") != "disabled":
        return True
    fields = {**request.aside, **request.own}
    return any(fields.get(name) is not None for name in _REASONING)


def needs_of(request: canon.Request) -> frozenset[Feature]:
    """The features a decoded request needs."""
    out = set()
    if (
        any(not t.builtin for t in request.tools)
        or (request.tool_choice is not None and request.tool_choice.choice in (canon.Choice.ANY, canon.Choice.TOOL))
        or request.own.get("functions")
    ):
        out.add(Feature.TOOLS)
    if request.output is not None or _json_mode(request.own):
        out.add(Feature.STRUCTURED_OUTPUT)
    if any(isinstance(p, canon.Image) for m in request.messages for p in m.parts):
        out.add(Feature.IMAGES)
    if _reasons(request):
        out.add(Feature.REASONING)
    return frozenset(out)


# A chat body's fields that needs_of reads (through chat_format.decode_request): its tools
# and tool choice, its answer's format, its reasoning settings; and the fields of other
# formats that _json_mode and _reasons read, were a chat body to carry them. Any other field
# asks for no feature.
_CHAT_FEATURE_FIELDS = frozenset({"tools", "tool_choice", "response_format", *_FUNCTIONS, *_JSON_MODE, *_REASONING})


def _chat_needs_nothing(request: Request) -> bool:
    """Whether a chat request needs no feature, read without decoding it: none of the
    fields that ask for one, and no image part in its messages (the only place a chat body
    carries images: decode_request reads an ``image_url`` part of a user message as one).
    False when it may need one; the whole decode then says which."""
    if not _CHAT_FEATURE_FIELDS.isdisjoint(request.extra):
        return False
    for m in request.messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "image_url":
                    return False
    return True


def needs(request: Request) -> frozenset[Feature]:
    """The features ``request`` (in its own format) needs; none when its body does not
    decode (the translation then says what is wrong with it)."""
    if request.format is Format.CHAT and _chat_needs_nothing(request):
        return frozenset()  # the common request: what the decode below would say, for a fraction of it
    from capmon.core.providers.formats import caller_body

    try:
        decoded = hub.FORMATS[request.format].decode_request(caller_body(request))
    except (CapmonError, ValueError, TypeError, KeyError):
        return frozenset()
    return needs_of(decoded)


def has(
    model: ModelConfig, api: EndpointApi, feature: Feature, learned: Collection[Feature] = ()
) -> tuple[bool, Source]:
    """Whether ``model`` (as one deployment sees it: ``ModelConfig.at``) has ``feature`` at an
    ``api`` endpoint, and where that was read."""
    said = getattr(model.capabilities, feature.value)
    if said is not None:
        return said, Source.CONFIG
    if feature in learned:
        return False, Source.LEARNED
    known = catalogue.entry(api, model.wire_name)
    if known is not None:
        value = getattr(known, feature.value)
        if value is not None:
            return value, Source.CATALOGUE
    return True, Source.ASSUMED


def max_output(model: ModelConfig, api: EndpointApi) -> int | None:
    """The largest output ``model`` gives at an ``api`` endpoint: the config's, else the
    catalogue's, else None (not known)."""
    if model.max_output:
        return model.max_output
    known = catalogue.entry(api, model.wire_name)
    return known.max_output if known is not None else None


_WHERE = {
    Source.CONFIG: "the config says so",
    Source.LEARNED: "its provider said so",
    Source.CATALOGUE: "the catalogue says so",
}


def lacking(
    request: Request, targets: Sequence[Target], learned: Lessons, needed: frozenset[Feature]
) -> dict[str, tuple[Feature | None, str]]:
    """Per target whose model lacks what ``request`` needs (``needed``: :func:`needs`): the
    first feature it lacks (None: the request's own output cap is above its largest output)
    and why, naming where that was read. The catalogue's lookups are cached
    (capmon/core/types/catalogue.py); what providers' 400s taught the process or its fleet
    (``learned``) is read per request."""
    cap = request.max_tokens
    out: dict[str, tuple[Feature | None, str]] = {}
    if not needed and cap is None:
        return out
    wanted = sorted(needed)
    for t in targets:
        gone = learned.lacks(t.deployment_id) if wanted else ()
        for feature in wanted:
            ok, source = has(t.model, t.endpoint.api, feature, gone)
            if not ok:
                out[t.id] = feature, f"it has no {feature.value} ({_WHERE[source]}), which the request needs"
                break
        else:
            most = max_output(t.model, t.endpoint.api) if cap is not None else None
            if most is not None and cap is not None and cap > most:
                out[t.id] = None, f"its largest output of {most:,} tokens is below the request's cap of {cap:,}"
    return out
