"""Snapshots and events survive JSON: what a gateway serves, a remote dashboard reads."""

from __future__ import annotations

import json

import pytest

from capmon.core.control.breaker import State
from capmon.core.control.seam import KeyState
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.failure import Kind
from capmon.core.types.serial import event_from_json, event_to_json, snapshot_from_json, snapshot_to_json
from tests.support.configs import ENV, three_models
from tests.support.scripted import OVERLOADED, Script, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]


async def test_a_live_snapshot_and_its_events_round_trip_through_json() -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    bus = ev.EventBus()
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV, bus=bus) as client:
        for _ in range(4):
            await client.chat("hi")
        snap = client.snapshot()
    back = snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap))))
    assert back == snap
    assert back.targets[0].state is State.OPEN and back.targets[0].last_kind is Kind.CAPACITY
    assert back.targets[1].key_state is KeyState.OK and back.targets[0].window(60).capacity == 3
    events = bus.recent()
    assert events and all(event_from_json(json.loads(json.dumps(event_to_json(e)))) == e for e in events)


def test_readers_are_lenient_and_refuse_what_is_no_snapshot() -> None:
    assert event_from_json({"type": "SomethingNew", "at": 1.0}) is None
    e = event_from_json({"type": "Notice", "at": 1.0, "wall": 2.0, "level": "info", "message": "hi", "extra": 1})
    assert e == ev.Notice(at=1.0, wall=2.0, level="info", message="hi")
    with pytest.raises(ValueError):
        snapshot_from_json({"targets": "nope"})
