"""benchmarks.ideal: the two oracles the benchmarks measure capmon against (pure: no
processes, no sockets, a few milliseconds)."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.ideal import ideal, known_slots
from capmon.sim.scenario import ModelSpec, Scenario, parse_scenario


def _model(name: str, slots: int, latency: float, schedule: str = "") -> str:
    # per_token 0: the mean service time is base_latency exactly (no float noise in the sums).
    return (
        f'[[models]]\nname = "{name}"\nslots = {slots}\nbase_latency = {latency}\n'
        f"per_token = 0.0\nanswer_tokens = 1\nnoise = 0.0\n{schedule}\n"
    )


def _scenario(*models: str) -> Scenario:
    return parse_scenario('name = "t"\n' + "".join(models))


def _phase(at: float, slots: int | None = None) -> str:
    return f"[[models.schedule]]\nat = {at}\n" + ("" if slots is None else f"slots = {slots}\n")


@pytest.mark.parametrize("informed", [False, True])
def test_constant_capacity_is_the_closed_form_for_both_oracles(informed: bool) -> None:
    # W = 8 workers on A (4 slots, 1 s) and B (2 slots, 0.5 s): c_A = 4, c_B = 2,
    # X = 4 / 1 + 2 / 0.5 = 8 items/s, so 80 items take N / X = 10 s, half of them on A.
    scn = _scenario(_model("a", 4, 1.0), _model("b", 2, 0.5))
    best = ideal(scn, 80, 8, informed=informed)
    assert best.makespan == pytest.approx(80 / 8.0)
    assert best.served == {"a": 40, "b": 40}
    assert best.preferred_share == pytest.approx((4 / 1.0) / 8.0)
    assert best.informed is informed
    # Capacity never rises, so the two oracles agree on every item, latencies included.
    assert dataclasses.replace(ideal(scn, 80, 8, informed=not informed), informed=informed) == best


# P (2 slots, 1 s) is out from t = 1 to t = 3; F (3 slots, 1 s) is always there; 3 workers.
OUTAGE = _scenario(_model("p", 2, 1.0, _phase(1, 0) + _phase(3)), _model("f", 3, 1.0))


def test_the_informed_oracle_learns_of_a_recovery_one_round_trip_late() -> None:
    # By hand, 12 items, in rounds of 1 s (every request takes 1 s, so all end together):
    #   [0, 1): P 2, F 1 (P's 2 slots at the start are known: the starting state);
    #   [1, 2) and [2, 3): P has none, F 3 each;
    #   [3, 4): the old oracle sees P back at once: P 2, F 1 -> P 4 of 12, done at 4 s;
    #           the informed one learns of it at 3 + 1 = 4 s, so F 3 -> P 2 of 12, done at 4 s.
    old = ideal(OUTAGE, 12, 3)
    informed = ideal(OUTAGE, 12, 3, informed=True)
    assert old.served == {"p": 4, "f": 8}
    assert informed.served == {"p": 2, "f": 10}
    assert informed.preferred_share < old.preferred_share
    assert old.makespan == informed.makespan == pytest.approx(4.0)


def test_a_fall_is_known_at_once_and_the_capacity_at_the_start_is_known() -> None:
    p = OUTAGE.models[0]
    known = {t: known_slots(p, t, 0.0, 0.0) for t in (0.0, 0.5, 1.0, 2.9, 3.0, 3.5, 3.999, 4.0, 9.0)}
    assert known == {0.0: 2, 0.5: 2, 1.0: 0, 2.9: 0, 3.0: 0, 3.5: 0, 3.999: 0, 4.0: 2, 9.0: 2}
    # A run that starts after the recovery, within one round trip of it: P's 2 slots are
    # its starting state, so the informed oracle uses them from the start, as the old one does.
    assert known_slots(p, 3.5, 0.0, 3.5) == 2
    late = ideal(OUTAGE, 12, 3, offset=3.5)
    assert ideal(OUTAGE, 12, 3, offset=3.5, informed=True) == dataclasses.replace(late, informed=True)
    assert late.served == {"p": 8, "f": 4}  # 2 + 1 a round, 4 rounds: P 8 of 12


def test_the_simulation_wakes_when_the_informed_oracle_learns() -> None:
    # One model with no room until t = 1, then 1 slot; 1 worker, 1 item. Nothing ends
    # between 1 s and 2 s: only the wake at the step + one round trip (1 + 1 s) starts it.
    scn = _scenario(_model("p", 0, 1.0, _phase(1, 1)))
    assert ideal(scn, 1, 1).makespan == pytest.approx(2.0)  # starts at 1 s, the step
    best = ideal(scn, 1, 1, informed=True)
    assert best.makespan == pytest.approx(3.0)  # starts at 2 s, when it learns of the step
    assert best.latencies == pytest.approx((3.0,))


def test_the_floor_oracle_sends_no_more_than_the_initial_limit_until_its_first_answers() -> None:
    # One model, 4 slots, 1 s per request, 8 items on 8 workers: the informed oracle sends 4
    # at once, then 4 more, done at 2 s; held to 2 until its first answers (1 s), it sends
    # 2, then 4 at 1 s, then the last 2 at 2 s: done at 3 s.
    scn = Scenario(models=(ModelSpec(name="m", slots=4, base_latency=1.0, per_token=0.0, answer_tokens=0),))
    free = ideal(scn, 8, 8, informed=True)
    held = ideal(scn, 8, 8, informed=True, start=2)
    assert free.makespan == pytest.approx(2.0)
    assert held.makespan == pytest.approx(3.0)


def test_an_rpm_bucket_holds_a_model_to_a_minute_s_worth_then_its_rate() -> None:
    # A and B, 4 slots and 1 s each, 8 workers: 8 items a round, one round a second.
    scn = _scenario(_model("a", 4, 1.0), _model("b", 4, 1.0))
    # 120 rpm on A: its bucket (120 at the start, 2 a second in) outlasts 18 rounds of 4.
    assert ideal(scn, 140, 8, rpm={"a": 120}) == ideal(scn, 140, 8)
    # 12 rpm (one every 5 s), 40 items. By hand: A takes 4 at t = 0, 1 and 2 (12 -> 8 -> 4.2 ->
    # 0.4 tokens, 0.2 coming in a second); B 4 a round throughout. At t = 3 and 4 only B (24 + 8
    # done); at t = 5 A has a token again: B 4 and A 1 (37 done); the last 3 at t = 6 on B,
    # answered at 7.
    tight = ideal(scn, 40, 8, rpm={"a": 12})
    assert tight.served == {"a": 13, "b": 27}
    assert tight.makespan == pytest.approx(7.0)
    assert ideal(scn, 40, 8).makespan == pytest.approx(5.0)


def test_every_send_is_recorded_with_its_answer_time() -> None:
    scn = _scenario(_model("a", 2, 1.0), _model("b", 2, 0.5))
    o = ideal(scn, 10, 4)
    assert len(o.sends) == 10 and [s.at for s in o.sends] == sorted(s.at for s in o.sends)
    assert {m: sum(1 for s in o.sends if s.model == m) for m in "ab"} == o.served
    assert all(s.until - s.at == pytest.approx(1.0 if s.model == "a" else 0.5) for s in o.sends)
    assert o.makespan == pytest.approx(max(s.until for s in o.sends))
