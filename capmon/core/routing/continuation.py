"""A streamed answer that broke after output reached the caller, finished by the next attempt.

When a stream breaks after output (a cut, an in-stream overload), the answer so far is not
thrown away: the request goes again (the same model or the next, by the normal routing)
with the partial answer appended, and only the new text reaches the caller, spliced into
the stream it already has, so the caller sees one continuous answer in its own format:

* the request (:func:`continued_request`): the caller's request with the partial answer as
  an assistant message, in the caller's format (its format module's ``continued``). The
  attempt's normal way
  (capmon/core/providers/formats.py) carries it to the target's wire, through the hub when
  the formats differ. On Anthropic's Messages wire an assistant message at the end is a
  *prefill*: the model goes on from its last character. Elsewhere (OpenAI's APIs continue
  no assistant message), for a model declared ``prefill = false``, or one whose 400 said
  it takes none (:func:`refuses_prefill`: learned once, the request retried at once, that
  400 never the caller's error), a user message follows it: :data:`INSTRUCTION`.
* the stream (a :class:`~capmon.core.providers.splice.Splice`, one per caller format, made
  by its format module's ``splicer``: formats.splicer): what went to the caller is followed
  as it goes (the text, the open block or item, the ids, the sequence numbers); a
  continuation's events are fitted into it: no second start (``message_start``,
  ``response.created``, a role chunk), the open text block or item goes on under its own
  index and id, later ones are numbered after it, the end carries the usage of every
  request and says who continued it (``capmon_continued``: a list of ``{"model", "offset"}``).
* what cannot be continued: a break inside a tool call's arguments that already reached the
  caller (the call is never sent as whole: the stream ends with a clear error), an answer
  with anything but text before the break, a caller who opted out, a request past
  ``[client] continuations``. Those end as before: RequestFailed, a clear in-band error.

See ARCHITECTURE.md, "Continuing a broken answer".
"""

from __future__ import annotations

from capmon.core.providers import formats
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Request

# What a model that takes no prefill is asked, after the partial answer as its own message.
# It names no tool, so a tool loop reads it as no request for a call.
INSTRUCTION = (
    "Your previous message was cut off. Continue it from exactly where it stops, without repeating"
    " any of it: begin with the very next characters."
)

# The words of a provider's 400 that refuses an assistant prefill (Anthropic's models that
# take none; the trailing whitespace rule of the ones that do).
_REFUSALS = (
    "prefill",  # "does not support assistant message prefill", and any other wording that names it
    "final assistant content cannot end with trailing whitespace",
)


def refuses_prefill(failure: Failure | None) -> bool:
    """Whether ``failure`` is a target's refusal of an assistant prefill (a 400 that names it)."""
    if failure is None or failure.kind is not Kind.BAD_REQUEST:
        return False
    reason = failure.reason.lower()
    return any(words in reason for words in _REFUSALS)


def continued_request(request: Request, text: str, *, prefill: bool) -> tuple[Request, str]:
    """``request`` with the partial answer ``text`` as the assistant's message, in the
    caller's format, and the whitespace taken off its end (a prefill may not end with any:
    the continuation's first characters make up for it). ``prefill`` False: a user message
    with :data:`INSTRUCTION` follows."""
    strip = text.rstrip() if prefill else text
    trailing = text[len(strip) :]
    return formats.continued(request, strip, None if prefill else INSTRUCTION), trailing
