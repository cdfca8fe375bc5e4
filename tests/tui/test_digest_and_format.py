"""The pure parts: cell formatting and the event digest (no app needed)."""

from __future__ import annotations

import pytest

from capmon.core.base import text
from capmon.core.routing.targets import target_id
from capmon.core.types import events as ev
from capmon.core.types.snapshot import EngineSnapshot
from capmon.tui import format as fmt
from capmon.tui.digest import EventDigester
from capmon.tui.widgets.models_table import MAX_MODEL_WIDTH, MODEL_WIDTH, ModelsTable, matches
from tests.tui.fakes import target


def fell_back(wall: float, a: str = "flagship", b: str = "medium") -> ev.FellBack:
    return ev.FellBack(at=wall, wall=wall, request_id=1, item_id=None, from_model=a, to_model=b, reason="full")


def tripped(at: float, model: str = "flagship", new: str = "open") -> ev.BreakerChanged:
    return ev.BreakerChanged(
        at=at,
        wall=at,
        target=target_id(model, "sim", "k"),
        model=model,
        old="closed",
        new=new,
        reason="3 capacity failures in a row",
        manual=new.startswith("forced"),
        cooldown_until=at + 20 if new == "open" else None,
    )


@pytest.mark.parametrize(
    "state, text",
    [
        ("closed", "● closed"),
        ("half-open", "◐ half-open"),
        ("open", "○ open"),
        ("forced-open", "✋ open (manual)"),
        ("forced-closed", "✋ closed (manual)"),
    ],
)
def test_every_state_has_a_glyph_and_a_word(state: str, text: str) -> None:
    assert fmt.state_text(target("m", 0, state=state)).plain == text


def test_manual_states_are_reversed_automatic_ones_are_not() -> None:
    assert "on" in str(fmt.state_text(target("m", 0, state="forced-open")).style)
    assert "on" not in str(fmt.state_text(target("m", 0, state="open")).style)


def test_the_ramp_shows_its_share() -> None:
    assert fmt.state_text(target("m", 0, state="ramp", ramp_share=0.4)).plain == "◑ ramp 40%"


@pytest.mark.parametrize(
    "seconds, shown", [(4.23, "4.2s"), (42.4, "42s"), (185, "3m05s"), (3720, "1h02m"), (-3, "0.0s")]
)
def test_durations(seconds: float, shown: str) -> None:
    assert text.countdown(seconds) == shown


def test_the_cool_down_is_a_deadline_minus_the_snapshot_clock() -> None:
    t = target("m", 0, state="open", cooldown_until=1020.0)
    assert fmt.breaker_cell(t, 1000.0).plain == "○ open, probe 20s"
    assert fmt.breaker_cell(t, 1015.5).plain == "○ open, probe 4.5s"
    assert fmt.breaker_cell(t, 1021.0).plain == "○ open"


def test_the_breaker_cell_counts_failures_toward_a_trip_only_while_closed() -> None:
    assert fmt.breaker_cell(target("m", 0, fails=2), 0.0).plain == "● closed, 2 fails"
    assert fmt.breaker_cell(target("m", 0, fails=1), 0.0).plain == "● closed, 1 fail"
    assert fmt.breaker_cell(target("m", 0), 0.0).plain == "● closed"
    # Tripped by hand: no probe comes, the word says so.
    held = target("m", 0, state="forced-open", fails=3, cooldown_until=50.0)
    assert fmt.breaker_cell(held, 0.0).plain == "✋ open (manual)"


def test_the_spark_has_one_block_per_point_on_a_shared_scale() -> None:
    assert fmt.spark((0, 5, 10), top=10).plain == "▁▅█"
    assert fmt.spark((0, 1, 2), top=10).plain == "▁▂▂"  # small counts look small
    assert len(fmt.spark((0,) * 24).plain) == 24


def test_keys_parked_or_disabled() -> None:
    assert fmt.key_text(target("m", 0, key_state="parked", key_until=1600.0), 1000.0).plain == "parked 10m"
    assert fmt.key_text(target("m", 0, key_state="disabled"), 1000.0).plain == "disabled"


def test_fallbacks_in_one_second_become_one_line_even_across_digests() -> None:
    d = EventDigester()
    first = d.digest([fell_back(100.1), fell_back(100.4)], now_wall=100.5)
    assert first.lines == [] and d.holding
    second = d.digest([fell_back(100.8), fell_back(101.2)], now_wall=101.3)
    assert [line.plain for _, line in second.lines] == ["↪ 3 fallbacks flagship → medium (full)"]
    last = d.digest([], now_wall=102.0)
    assert [line.plain for _, line in last.lines] == ["↪ fell back flagship → medium (full)"]
    assert not d.holding


def test_pairs_are_counted_apart_and_lines_come_in_time_order() -> None:
    d = EventDigester()
    out = d.digest([fell_back(5.0), tripped(5.5), fell_back(5.2, "medium", "small"), fell_back(5.3)])
    assert [line.plain.split(" (")[0] for _, line in out.lines] == [
        "↪ 2 fallbacks flagship → medium",
        "↪ fell back medium → small",
        "○ flagship breaker closed → open",
    ]


def test_a_burst_is_capped_and_says_how_much_it_left_out() -> None:
    d = EventDigester(max_lines=5)
    out = d.digest([ev.Notice(at=i, wall=i, level="info", message=f"n{i}") for i in range(12)])
    assert len(out.lines) == 5 and out.left_out == 7


def test_noise_is_not_logged() -> None:
    d = EventDigester()
    assert not d.wants(ev.AttemptStarted(at=0, wall=0, request_id=1, item_id=None, model="m", target="t", attempt=1))
    assert not d.wants(
        ev.RetryScheduled(
            at=0,
            wall=0,
            request_id=1,
            item_id=None,
            model=None,
            attempt=2,
            max_attempts=5,
            reason="",
            wait=1,
            deadline=1,
        )
    )
    assert d.wants(tripped(0))


def test_trip_toasts_are_throttled_per_target_but_manual_ones_never() -> None:
    d = EventDigester(toast_every=10.0)
    assert [t.title for t in d.digest([tripped(0.0)]).toasts] == ["Breaker tripped"]
    assert d.digest([tripped(5.0)]).toasts == []  # the same breaker again within 10 s
    assert len(d.digest([tripped(6.0, "medium")]).toasts) == 1
    assert len(d.digest([tripped(7.0, new="forced-open"), tripped(7.5, new="forced-open")]).toasts) == 2
    assert d.digest([tripped(20.0)], toasts=False).toasts == []


def test_a_fallback_across_providers_names_both_apis_and_is_toasted_once() -> None:
    def crossing(wall: float, a: str = "flagship", b: str = "claude", api_a: str = "openai", api_b: str = "anthropic"):
        return ev.FellBack(
            at=wall,
            wall=wall,
            request_id=1,
            item_id=None,
            from_model=a,
            to_model=b,
            reason="full",
            from_api=api_a,
            to_api=api_b,
        )

    d = EventDigester()
    out = d.digest([crossing(5.1), crossing(5.4), crossing(5.6, "medium", "small", "openai", "openai")])
    assert [line.plain for _, line in out.lines] == [
        "↪ 2 fallbacks flagship (openai) → claude (anthropic) (full)",
        "↪ fell back medium → small (full)",  # one provider: the APIs would say nothing
    ]
    assert [(t.title, t.message) for t in out.toasts] == [
        ("Fell back across providers", "flagship (openai) → claude (anthropic)")
    ]
    assert not d.digest([crossing(20.0)]).toasts  # news once; the log counts the rest
    # An event from a source older than the API fields: plain, as before.
    old = ev.FellBack(at=1.0, wall=1.0, request_id=1, item_id=None, from_model="a", to_model="b", reason="")
    assert not old.crosses_providers
    assert fmt.fallback_line("a", "b", 1, "", old.from_api, old.to_api).plain == "↪ fell back a → b"


def moved(wall: float, to: str = "vertex", to_id: str = "claude-sonnet-4-5@20250929") -> ev.DeploymentMoved:
    return ev.DeploymentMoved(
        at=wall,
        wall=wall,
        request_id=1,
        item_id=None,
        model="claude",
        from_endpoint="anthropic",
        to_endpoint=to,
        from_deployment="claude-sonnet-4-5",
        to_deployment=to_id,
        reason="full",
    )


def test_a_move_between_deployments_is_its_own_line_counted_per_second_and_never_a_fallback() -> None:
    d = EventDigester()
    assert d.wants(moved(0.0))
    out = d.digest([moved(5.1), fell_back(5.2), moved(5.4), moved(5.6, "bedrock", "us.anthropic.claude")])
    assert [line.plain for _, line in out.lines] == [
        "⇉ claude moved anthropic → vertex as claude-sonnet-4-5@20250929 ×2 (full)",
        "↪ fell back flagship → medium (full)",
        "⇉ claude moved anthropic → bedrock as us.anthropic.claude (full)",
    ]
    assert not out.toasts
    # the id is left out where it is the model's name
    assert fmt.moved_line("m", "east", "west", "m", 1, "").plain == "⇉ m moved east → west"


def _snapshot(*rows: object) -> EngineSnapshot:
    return EngineSnapshot(
        now=0.0,
        wall=0.0,
        pinned=None,
        targets=tuple(rows),  # type: ignore[arg-type]
        waiting=(),
        queued=0,
        in_flight=0,
        requests=0,
        succeeded=0,
        failed=0,
        events_published=0,
    )


def test_a_models_rows_name_their_deployment_and_its_id_where_the_ids_differ() -> None:
    rows = (
        target("claude", 0, endpoint="anthropic", deployment="claude-sonnet-4-5"),
        target("claude", 0, endpoint="vertex", key="k1", deployment="claude-sonnet-4-5@20250929"),
        target("claude", 0, endpoint="vertex", key="k2", deployment="claude-sonnet-4-5@20250929"),
        target("flagship", 1, deployment="sim-flagship"),  # one id everywhere: the model's own
        target("medium", 2, endpoint="a", deployment="sim-medium"),
        target("medium", 2, endpoint="b", deployment="sim-medium"),
    )
    snap = _snapshot(*rows)
    names = [ModelsTable._label(t, snap, MAX_MODEL_WIDTH - 2).plain.strip() for t in rows]
    assert names == [
        "claude@anthropic (claude-sonnet-4-5)",
        "claude@vertex/k1 (claude-sonnet-4-5@20250929)",
        "claude@vertex/k2 (claude-sonnet-4-5@20250929)",
        "flagship",
        "medium@a",
        "medium@b",
    ]
    assert [t.endpoint for t in rows if matches(t, "@2025")] == ["vertex", "vertex"]  # the filter finds the id
    # the column's usual width clips a long name
    assert ModelsTable._label(rows[1], snap).plain == "  claude@vertex/k1…" and MODEL_WIDTH == 17
