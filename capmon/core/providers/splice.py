"""What every format's splice shares: a streamed answer's chunks in the caller's format as
they went out, and a continuation's fitted into them (:class:`Splice`; a subclass per format,
in its format module: ``splicer``), and what the caller has of a broken answer
(:class:`Partial`). See capmon/core/routing/continuation.py and ARCHITECTURE.md, "Continuing
a broken answer"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from capmon.core.providers.tokens import tokens_for_chars
from capmon.core.types.result import Continued

# The field the end of a continued stream carries (a chat chunk, a Messages message_delta,
# a Responses response): who continued the answer and from which character.
FIELD = "capmon_continued"


@dataclass(frozen=True, slots=True)
class Partial:
    """What the caller has of a broken answer."""

    text: str  # its text, every text block's in order
    half_call: bool = False  # a tool call's arguments reached the caller, and the call never ended
    other: bool = False  # something but text reached the caller (a whole tool call): not continued

    @property
    def why_not(self) -> str | None:
        """Why this answer cannot be continued (None: it can)."""
        if self.half_call:
            return "it broke inside a tool call's arguments that had reached the caller"
        if self.other:
            return "the caller already had more than text (a tool call)"
        return None


def add_usage(usage: Mapping[str, Any], names: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """``usage`` with each count named in ``names`` raised by its amount (a count it lacks stays out)."""
    out = dict(usage)
    for name, more in names:
        value = out.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = value + more
    return out


@dataclass
class Splice:
    """A stream's chunks in the caller's format as they went out (:meth:`sent`), and a
    continuation's fitted into them (:meth:`fit`). The base class knows the text and the
    usage to add; a subclass per format knows its events."""

    prompt: int  # the tokens of the request each earlier attempt sent (estimated)
    records: list[Continued] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    half_call: bool = False
    other: bool = False
    earlier_in: int = 0  # tokens the earlier attempts read and wrote (estimated: they never said)
    earlier_out: int = 0
    _trim: str = ""  # whitespace the prefill left off, which the continuation says again
    _fitted: bool = False  # the latest continuation has sent the caller something

    @property
    def offset(self) -> int:
        return sum(len(t) for t in self.text)

    def partial(self) -> Partial:
        return Partial("".join(self.text), self.half_call, self.other)

    def begin(self, model: str, trailing: str) -> None:
        """A continuation by ``model`` begins: the attempt that broke counts in the usage."""
        self._trim = trailing
        if self.records and not self._fitted:  # the last continuation's attempt sent nothing: another goes on
            self.records[-1] = Continued(model, self.records[-1].offset)
            return
        before = self.records[-1].offset if self.records else 0
        self.records.append(Continued(model, self.offset))
        self.earlier_in += self.prompt
        self.earlier_out += tokens_for_chars(self.offset - before)
        self._fitted = False

    def _text(self, piece: str) -> str:
        """A continuation's text, the whitespace the prefill left off (and said already) taken off its start."""
        if self._trim and piece:
            n = 0
            while n < len(piece) and n < len(self._trim) and piece[n] == self._trim[n]:
                n += 1
            self._trim = ""
            piece = piece[n:]
        return piece

    def said(self) -> list[dict[str, Any]]:
        return [r.as_json() for r in self.records]

    def out(self, chunk: Mapping[str, Any]) -> None:
        """``chunk`` went to the caller."""
        self._fitted = True
        self.sent(chunk)

    def sent(self, chunk: Mapping[str, Any]) -> None:  # pragma: no cover - each format's
        raise NotImplementedError

    def fit(self, chunk: Mapping[str, Any]) -> list[Mapping[str, Any]]:  # pragma: no cover - each format's
        raise NotImplementedError
