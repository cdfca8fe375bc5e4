"""A remote dashboard reads the API of each target and of each fallback from a gateway's
JSON, and still reads a gateway that sends none (one from before the field)."""

from __future__ import annotations

from capmon.core.types import events as ev
from capmon.core.types.config import EndpointApi
from capmon.core.types.serial import event_from_json, event_to_json, snapshot_from_json, snapshot_to_json
from tests.tui.fakes import outage


def test_the_api_goes_through_json_and_an_older_gateways_json_still_reads() -> None:
    snap = outage().snapshot()
    data = snapshot_to_json(snap)
    assert {t["model"]: t["api"] for t in data["targets"]}["claude"] == "anthropic"
    back = snapshot_from_json(data)
    assert back == snap and {t.model: t.api for t in back.targets}["claude"] is EndpointApi.ANTHROPIC

    for t in data["targets"]:
        del t["api"]
    older = snapshot_from_json(data)
    assert {t.api for t in older.targets} == {EndpointApi.OPENAI}  # before the field: OpenAI's wire only

    fell = ev.FellBack(
        at=1.0,
        wall=2.0,
        request_id=1,
        item_id=None,
        from_model="flagship",
        to_model="claude",
        reason="full",
        from_api="openai",
        to_api="anthropic",
    )
    sent = event_to_json(fell)
    assert event_from_json(sent) == fell
    del sent["from_api"], sent["to_api"]
    old = event_from_json(sent)
    assert isinstance(old, ev.FellBack) and (old.from_api, old.to_api) == ("", "") and not old.crosses_providers
