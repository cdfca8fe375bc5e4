"""The token-parameter quirk: OpenAI's reasoning models take ``max_completion_tokens`` and
refuse ``max_tokens``, while older servers take only ``max_tokens``. :class:`TokenParams`
holds which one each model is sent (configured, then learned from refusals); whether a
failure is such a refusal is the wire's format's to say (``chat_format.refused_token_param``:
only chat completions has two token parameters). See ARCHITECTURE.md, "The wire".
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping

log = logging.getLogger("capmon.client")


class TokenParam(enum.StrEnum):
    MAX_TOKENS = "max_tokens"
    MAX_COMPLETION_TOKENS = "max_completion_tokens"

    @property
    def other(self) -> TokenParam:
        return TokenParam.MAX_COMPLETION_TOKENS if self is TokenParam.MAX_TOKENS else TokenParam.MAX_TOKENS


class TokenParams:
    """Which token parameter each model is sent: configured, then learned from refusals.
    ``on_learn(model, param, reason)`` is told of each change (the client publishes it)."""

    def __init__(self, configured: Mapping[str, str], on_learn: Callable[[str, str, str], None]) -> None:
        self._param = {model: TokenParam(p) for model, p in configured.items()}
        self._on_learn = on_learn

    def __getitem__(self, model: str) -> TokenParam:
        return self._param[model]

    def learn(self, model: str, refused: TokenParam, reason: str) -> None:
        """The model refused ``refused``: send the other from now on."""
        if self._param[model] is refused:
            self._param[model] = refused.other
            log.info("model %s refused %s; sending %s from now on", model, refused.value, refused.other.value)
            self._on_learn(model, refused.other.value, reason)
