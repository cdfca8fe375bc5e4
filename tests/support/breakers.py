"""Bringing a client's breakers to a state for a test, through real failed requests."""

from __future__ import annotations

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types.result import Request


async def open_every_breaker(client: FallbackClient) -> None:
    """Fail short requests until every target's breaker has opened by itself (every model
    must be failing with capacity errors)."""
    while {t.state.view().breaker.state for t in client.targets} != {"open"}:
        with pytest.raises(RequestFailed):
            await client.chat(Request.of("trip", deadline=1))
