"""The token-parameter quirk: OpenAI's reasoning models take ``max_completion_tokens`` and
refuse ``max_tokens``, while older servers take only ``max_tokens``. :class:`TokenParams`
holds which one each model's deployment is sent (configured, then learned from refusals); whether a
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


# A deployment: (model name, endpoint name). Each has its token parameter: two endpoints
# that serve one model may be different servers (an Azure deployment of a reasoning model,
# a vLLM that knows only max_tokens), and a deployment may configure its own.
Deployment = tuple[str, str]


class TokenParams:
    """Which token parameter each deployment of a model is sent: configured, then learned
    from its refusals (a refusal teaches the deployment that answered it, not the model's
    others). ``on_learn(deployment, param, reason)`` is told of each change (the client
    publishes it)."""

    def __init__(self, configured: Mapping[Deployment, str], on_learn: Callable[[Deployment, str, str], None]) -> None:
        self._param = {where: TokenParam(p) for where, p in configured.items()}
        self._on_learn = on_learn

    def __getitem__(self, where: Deployment) -> TokenParam:
        return self._param[where]

    def of(self, model: str) -> TokenParam | None:
        """What ``model``'s first deployment is sent (None: no such model)."""
        return next((p for (m, _), p in self._param.items() if m == model), None)

    def learn(self, where: Deployment, refused: TokenParam, reason: str) -> None:
        """The deployment refused ``refused``: send it the other from now on."""
        if self._param[where] is refused:
            self._param[where] = refused.other
            log.info("model %s at %s refused %s; sending %s from now on", *where, refused.value, refused.other.value)
            self._on_learn(where, refused.other.value, reason)
