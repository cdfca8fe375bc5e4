"""Command palette (ctrl+p) commands: pin a model, automatic routing, trip, reset."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from textual.command import DiscoveryHit, Hit, Hits, Provider


class ModelCommands(Provider):
    """Manual routing from the palette. A read-only dashboard offers none of these."""

    def _commands(self) -> list[tuple[str, Callable[[], Any], str]]:
        app: Any = self.app
        source = getattr(app, "source", None)
        if source is None or source.readonly:
            return []
        out: list[tuple[str, Callable[[], Any], str]] = [
            ("Automatic routing", partial(app.pin_model, None), "Unpin: traffic follows the preference order"),
        ]
        for model in source.models:
            out.append((f"Pin model: {model}", partial(app.pin_model, model), f"Send traffic to {model} first"))
        for model in source.models:
            out.append(
                (f"Trip breaker: {model}", partial(app.request_trip, model), f"Stop traffic to {model} until reset")
            )
            out.append(
                (
                    f"Reset breaker: {model}",
                    partial(app.reset_target, model),
                    f"Close {model}'s breaker, clear parked keys",
                )
            )
        return out

    async def discover(self) -> Hits:
        for text, command, help_text in self._commands():
            yield DiscoveryHit(text, command, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, command, help_text in self._commands():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), command, help=help_text)
