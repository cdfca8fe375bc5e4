"""A request that asks the model to go on with an answer it had begun (a client continuing a
broken stream): the partial answer as the conversation's last message, the model's own (an
assistant prefill), or the model's followed by a user's request to continue it. The
simulator answers it with the rest of the text it would have given (capmon/sim/streams.py,
``answer_text``), so a client's whole answer can be compared with an unbroken one; a model
whose scenario says ``prefill = false`` refuses a prefill as Anthropic's models that take
none do (a 400 that names it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from capmon.sim.tools import text_of

PREFILL_REFUSAL = (
    "This model does not support assistant message prefill. The conversation must end with a user message."
)
_MODEL_ROLES = ("assistant", "model")
# The words of a request to continue (the client's instruction says "cut off" and "continue").
_ASKS = ("cut off", "continue")

D = TypeVar("D")


def resumed(messages: Iterable[Any]) -> tuple[str | None, bool]:
    """The partial answer a conversation asks the model to go on with (None: none), and
    whether it is a prefill (the conversation ends with the model's message)."""
    items = [m for m in messages if isinstance(m, Mapping)]
    if not items:
        return None, False
    last = items[-1]
    if last.get("role") in _MODEL_ROLES:
        return text_of(last.get("content")), True
    if len(items) > 1 and last.get("role") == "user" and items[-2].get("role") in _MODEL_ROLES:
        said = text_of(last.get("content")).lower()
        if all(word in said for word in _ASKS):
            return text_of(items[-2].get("content")), False
    return None, False


def with_resume(decision: D, resume: str | None) -> D:
    """``decision`` (admitted or faulted) with its ticket going on from ``resume``."""
    ticket = getattr(decision, "ticket", None)
    if resume is None or ticket is None:
        return decision
    return dataclasses.replace(decision, ticket=dataclasses.replace(ticket, resume=resume))  # type: ignore[type-var]
