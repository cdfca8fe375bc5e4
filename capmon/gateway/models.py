"""The model names a client may send: the config's models, its aliases, and ``auto``
(the preference order); and the OpenAI list of them for ``GET /v1/models``.

An alias whose name holds ``*``, ``?`` or ``[`` is a pattern (fnmatch's, case-sensitive:
``claude-*``), so that a client's own default names (Claude Code's ``claude-opus-4-8``,
Codex's ``gpt-6.2-sol``) reach the gateway's models without a line per name. A model's
name and an exact alias always win over a pattern; among patterns the most specific wins:
the one with the most characters outside its wildcards (``claude-haiku-*`` over
``claude-*``), and on a tie the first in the table.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capmon.gateway.errors import ApiError

WILDCARDS = frozenset("*?[")
# Names longer than this are matched without the cache: a client chooses them, and the
# cache must not hold its megabytes.
_CACHED_NAME_CHARS = 256
_CACHED_NAMES = 1024


def is_pattern(name: str) -> bool:
    """Whether an alias's name is a pattern rather than a name a client sends as it is."""
    return not WILDCARDS.isdisjoint(name)


def literal_chars(pattern: str) -> int:
    """The characters of ``pattern`` matched as themselves: the pattern's specificity. A
    ``[...]`` set counts as a wildcard, an unclosed ``[`` as a literal, as fnmatch reads them."""
    count, i, n = 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c in "*?":
            continue
        if c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j < n:  # a closed set: one character of several
                i = j + 1
                continue
        count += 1
    return count


@dataclass(frozen=True)
class AliasPattern:
    pattern: str
    target: str | None  # a configured model; None: the preference order
    regex: re.Pattern[str]

    @staticmethod
    def of(pattern: str, target: str | None) -> AliasPattern:
        return AliasPattern(pattern, target, re.compile(fnmatch.translate(pattern)))


def by_precedence(aliases: Mapping[str, str | None]) -> tuple[AliasPattern, ...]:
    """The pattern aliases, compiled, the one that wins first: the most literal characters,
    then the table's order (a TOML table keeps it)."""
    patterns = [(name, target) for name, target in aliases.items() if is_pattern(name)]
    ranked = sorted(enumerate(patterns), key=lambda item: (-literal_chars(item[1][0]), item[0]))
    return tuple(AliasPattern.of(name, target) for _, (name, target) in ranked)


class ModelNames:
    def __init__(self, models: Sequence[str], aliases: Mapping[str, str | None]) -> None:
        self.models = tuple(models)
        self.aliases = dict(aliases)  # as configured, patterns included (the control API shows them)
        self.exact = {name: target for name, target in aliases.items() if not is_pattern(name)}
        self.patterns = by_precedence(aliases)
        self._cached_pattern = functools.lru_cache(maxsize=_CACHED_NAMES)(self._first_pattern)

    def known(self, name: str) -> bool:
        """Whether ``name`` is one of the gateway's own names: a model or an exact alias (a
        pattern may match anything a client sends, a key pasted there too)."""
        return name in self.models or name in self.exact

    def accepts(self, name: str) -> bool:
        """Whether a request for ``name`` is routed: a model, an alias, or a name a pattern matches."""
        return self.known(name) or self.pattern_for(name) is not None

    def pattern_for(self, name: str) -> AliasPattern | None:
        """The pattern that wins for ``name``, or None (a model or an exact alias is not asked)."""
        if not self.patterns:
            return None
        if len(name) > _CACHED_NAME_CHARS:
            return self._first_pattern(name)
        return self._cached_pattern(name)

    def _first_pattern(self, name: str) -> AliasPattern | None:
        return next((p for p in self.patterns if p.regex.fullmatch(name)), None)

    def resolve(self, name: str) -> str | None:
        """The configured model to try first (None: the preference order). Raises the 404
        OpenAI answers for a model it does not know."""
        if name in self.models:
            return name
        if name in self.exact:
            return self.exact[name]
        pattern = self.pattern_for(name)
        if pattern is not None:
            return pattern.target
        shown = name if len(name) <= 100 else name[:99] + "…"
        raise ApiError(
            404,
            f"The model `{shown}` does not exist on this gateway. Models: {', '.join(self.models)}; "
            f"aliases: {', '.join(self.aliases)}.",
            "invalid_request_error",
            "model_not_found",
            "model",
        )

    def entry(self, name: str, created: int) -> dict[str, Any]:
        """The OpenAI model object of a name :meth:`resolve` took."""
        base = {"id": name, "object": "model", "created": created, "owned_by": "capmon"}
        if name in self.models:
            return base
        if name in self.exact:
            # null: the preference order (auto, or an alias of it)
            return {**base, "capmon_alias_of": self.exact[name]}
        pattern = self.pattern_for(name)
        assert pattern is not None, name
        return {**base, "capmon_alias_of": pattern.target, "capmon_pattern": pattern.pattern}

    def listing(self, created: int) -> dict[str, Any]:
        """The models and exact aliases: a pattern is not a model's id (``GET /v1/models/NAME``
        answers for each name it matches)."""
        names = list(self.models) + [a for a in self.exact if a not in self.models]
        return {"object": "list", "data": [self.entry(n, created) for n in names]}
