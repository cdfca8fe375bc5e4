"""What a person (the dashboard, the gateway's control API) does to the client by hand:
pin a model or one of its deployments, trip, force-close or reset a breaker (of a model, a
deployment or one target). Manual states are first class: they win
over the breaker's own moves until reset (ARCHITECTURE.md, "The breaker")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from capmon.core.base.exceptions import CapmonError
from capmon.core.control.seam import StateStore
from capmon.core.providers.token_param import TokenParams
from capmon.core.routing.targets import Target
from capmon.core.types.config import Config, deployment_id

if TYPE_CHECKING:
    from capmon.core.routing.client import Grant
    from capmon.core.routing.waiting import WaitQueue


class ManualControls:
    """Mixed into the FallbackClient, whose attributes these are."""

    config: Config
    state: StateStore
    targets: list[Target]
    _by_id: dict[str, Target]
    _token_param: TokenParams
    _queue: WaitQueue[Grant]
    _pins: dict[str, tuple[str, str | None]]

    @property
    def pinned(self) -> str | None:
        return self.state.pinned

    def model_names(self) -> list[str]:
        return [m.name for m in self.config.models]

    def target(self, name: str) -> Target:
        return self._by_id[name]

    def token_param(self, model: str, endpoint: str | None = None) -> str:
        """The token parameter the client sends to ``model`` at ``endpoint`` now (learned or
        configured; None: at its first deployment)."""
        param = self._token_param.of(model) if endpoint is None else self._token_param[(model, endpoint)]
        if param is None:
            raise KeyError(model)
        return param.value

    def pin(self, name: str | None) -> None:
        """Send traffic to ``name`` first, whatever the order says: a model, or one of its
        deployments (``model@endpoint``: the model first, and that deployment first of its
        own); ``None`` goes back to automatic."""
        if name is not None and name not in self.pinnable():
            raise CapmonError(f"no model or deployment named {name!r}; models: {', '.join(self.model_names())}")
        self.state.pin(name)
        self._queue.regroup()

    def pinnable(self) -> dict[str, tuple[str, str | None]]:
        """What a pin may name: each model (to itself, no endpoint) and, for a model with
        more than one, each deployment (``model@endpoint``, to the model and the endpoint)."""
        out: dict[str, tuple[str, str | None]] = {m: (m, None) for m in self.model_names()}
        for m in self.config.models:
            deployed = m.deployed()
            if len(deployed) > 1:
                out.update({deployment_id(m.name, d.endpoint): (m.name, d.endpoint) for d in deployed})
        return out

    @property
    def pinned_at(self) -> tuple[str | None, str | None]:
        """The pin as (model, endpoint): (None, None) when routing is automatic, (model, None)
        for a whole model. A pin another process of a fleet set that this config does not
        know counts as none."""
        pinned = self.state.pinned
        if pinned is None:
            return None, None
        return self._pins.get(pinned, (None, None))

    def _manual(self, name: str, action: Callable[[Target], None]) -> None:
        found = [t for t in self.targets if name in (t.id, t.model.name, t.deployment_id)]
        if not found:
            raise CapmonError(f"no model or target named {name!r}")
        for t in found:
            action(t)
        self._queue.regroup()

    def trip(self, name: str, reason: str = "tripped by hand") -> None:
        self._manual(name, lambda t: t.state.trip(reason))

    def force_close(self, name: str, reason: str = "closed by hand") -> None:
        self._manual(name, lambda t: t.state.force_close(reason))

    def reset(self, name: str, reason: str = "reset by hand") -> None:
        """Close the breaker and clear a parked or disabled key."""
        self._manual(name, lambda t: t.state.reset(reason))
