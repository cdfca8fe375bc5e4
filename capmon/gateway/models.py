"""The model names a client may send: the config's models, its aliases, and ``auto``
(the preference order); and the OpenAI list of them for ``GET /v1/models``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from capmon.gateway.errors import ApiError


class ModelNames:
    def __init__(self, models: Sequence[str], aliases: Mapping[str, str | None]) -> None:
        self.models = tuple(models)
        self.aliases = dict(aliases)

    def known(self, name: str) -> bool:
        """Whether ``name`` is one of the gateway's models or aliases."""
        return name in self.models or name in self.aliases

    def resolve(self, name: str) -> str | None:
        """The configured model to try first (None: the preference order). Raises the 404
        OpenAI answers for a model it does not know."""
        if name in self.models:
            return name
        if name in self.aliases:
            return self.aliases[name]
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
        if name in self.models:
            return {"id": name, "object": "model", "created": created, "owned_by": "capmon"}
        target = self.aliases[name]
        # null: the preference order (auto, or an alias of it)
        return {"id": name, "object": "model", "created": created, "owned_by": "capmon", "capmon_alias_of": target}

    def listing(self, created: int) -> dict[str, Any]:
        names = list(self.models) + [a for a in self.aliases if a not in self.models]
        return {"object": "list", "data": [self.entry(n, created) for n in names]}
