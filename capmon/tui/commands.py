"""Command palette (ctrl+p) commands: pin a model or a deployment, automatic routing, trip, reset."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from textual.command import DiscoveryHit, Hit, Hits, Provider

from capmon.core.types.config import deployment_id
from capmon.core.types.snapshot import EngineSnapshot


def _deployments(snap: EngineSnapshot | None) -> list[tuple[str, str]]:
    """(model, endpoint) of every deployment of a model served at more than one endpoint."""
    if snap is None:
        return []
    pairs = list(dict.fromkeys((t.model, t.endpoint) for t in snap.targets))
    return [(m, e) for m, e in pairs if sum(1 for m2, _ in pairs if m2 == m) > 1]


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
        names = list(source.models)
        snap = getattr(app, "snap", None)
        for model, endpoint in _deployments(snap):
            name = deployment_id(model, endpoint)
            names.append(name)
            out.append((f"Pin deployment: {name}", partial(app.pin_model, name), f"Send traffic to {name} first"))
        for name in names:
            out.append(
                (f"Trip breaker: {name}", partial(app.request_trip, name), f"Stop traffic to {name} until reset")
            )
            out.append(
                (
                    f"Reset breaker: {name}",
                    partial(app.reset_target, name),
                    f"Close {name}'s breaker, clear parked keys",
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
