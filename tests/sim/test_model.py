"""The simulator's pure logic on a manual clock: slots, schedules, overrides, penalty,
faults, counters, and scenario loading with clear errors."""

from __future__ import annotations

import json
import random

import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.faults import FaultInjector, FaultMode, FaultRule, parse_rules
from capmon.sim.model import Admitted, Faulted, NoCapacity, Penalised, Simulator, TooLong, UnknownModel, key_alias
from capmon.sim.scenario import (
    ModelSpec,
    PenaltySpec,
    Phase,
    Scenario,
    bundled_scenarios,
    load_scenario,
    parse_scenario,
)
from tests.support.clocks import ManualClock

KEY = SIMULATOR_DEMO_KEY


def make_sim(
    *,
    slots: int = 2,
    schedule: tuple[Phase, ...] = (),
    repeat: float = 0.0,
    penalty: PenaltySpec = PenaltySpec(),
    noise: float = 0.0,
    keys: tuple[str, ...] = (KEY,),
    **model: object,
) -> tuple[Simulator, ManualClock]:
    spec = ModelSpec(
        name="m",
        slots=slots,
        base_latency=1.0,
        per_token=0.01,
        noise=noise,
        answer_tokens=100,
        context_window=1000,
        dialect="openai-503",
        schedule=schedule,
        **model,
    )  # type: ignore[arg-type]
    other = ModelSpec(name="other", slots=5)
    clock = ManualClock()
    sim = Simulator(Scenario(models=(spec, other), repeat=repeat, penalty=penalty, keys=keys), clock)
    sim.start()
    return sim, clock


def ask(
    sim: Simulator,
    model: str = "m",
    *,
    prompt: int = 10,
    max_tokens: int | None = None,
    stream: bool = False,
    key: str = KEY,
):
    alias = sim.authenticate(key)
    assert alias is not None
    return sim.submit(alias, model, prompt_tokens=prompt, max_tokens=max_tokens, stream=stream)


# ---------------------------------------------------------------- slots


def test_full_model_rejects_at_once_and_a_release_frees_a_slot() -> None:
    sim, _ = make_sim(slots=2)
    a, b = ask(sim), ask(sim)
    assert isinstance(a, Admitted) and isinstance(b, Admitted)
    third = ask(sim)
    assert isinstance(third, NoCapacity)
    assert third.state.slots == 2 and third.state.in_flight == 2 and third.state.free == 0
    sim.release(a.ticket)
    sim.release(a.ticket)  # idempotent
    assert isinstance(ask(sim), Admitted)
    assert sim.state("m").in_flight == 2


def test_models_have_separate_slots() -> None:
    sim, _ = make_sim(slots=1)
    assert isinstance(ask(sim), Admitted)
    assert isinstance(ask(sim), NoCapacity)
    assert isinstance(ask(sim, "other"), Admitted)


def test_service_time_and_answer_length() -> None:
    sim, _ = make_sim(slots=4)
    full = ask(sim)
    assert isinstance(full, Admitted)
    t = full.ticket
    assert (t.completion_tokens, t.finish_reason) == (100, "stop")
    assert t.service_time == pytest.approx(1.0 + 0.01 * 100)
    short = ask(sim, max_tokens=10)
    assert isinstance(short, Admitted)
    assert (short.ticket.completion_tokens, short.ticket.finish_reason) == (10, "length")
    assert short.ticket.service_time == pytest.approx(1.0 + 0.01 * 10)
    long = ask(sim, max_tokens=500)
    assert isinstance(long, Admitted) and long.ticket.completion_tokens == 100


def test_noise_is_multiplicative_bounded_and_seeded() -> None:
    def times(seed: int) -> list[float]:
        spec = ModelSpec(name="m", slots=1000, base_latency=1.0, per_token=0.0, noise=0.5)
        sim = Simulator(Scenario(models=(spec,), seed=seed), ManualClock())
        out = []
        for _ in range(200):
            d = sim.submit(key_alias(KEY), "m", prompt_tokens=1, max_tokens=None)
            assert isinstance(d, Admitted)
            out.append(d.ticket.service_time)
        return out

    a = times(1)
    assert all(0.5 <= t <= 1.5 for t in a)
    assert max(a) - min(a) > 0.5  # it really varies
    assert times(1) == a and times(2) != a


def test_context_window_and_unknown_model() -> None:
    sim, _ = make_sim()
    too_long = ask(sim, prompt=900, max_tokens=101)
    assert too_long == TooLong(1000, 900, 101)
    assert isinstance(ask(sim, prompt=900, max_tokens=100), Admitted)
    assert ask(sim, "nope") == UnknownModel("nope")
    stats = sim.stats()
    assert stats["totals"]["rejected"]["bad_request"] == 2
    assert stats["models"]["m"]["rejected"]["bad_request"] == 1


# ---------------------------------------------------------------- schedule and overrides


def test_schedule_phases_and_repeat() -> None:
    schedule = (
        Phase(at=20, slots=0, dialect="capacity-text"),
        Phase(at=45),
        Phase(at=60, latency_factor=3.0, hint=2.0),
    )
    sim, clock = make_sim(slots=6, schedule=schedule, repeat=120)
    s = sim.state("m")
    assert (s.slots, s.dialect, s.phase, s.latency_factor, s.hint) == (6, "openai-503", None, 1.0, None)
    clock.advance(20)
    s = sim.state("m")
    assert (s.slots, s.dialect, s.phase) == (0, "capacity-text", 0)
    rejected = ask(sim)
    assert isinstance(rejected, NoCapacity) and rejected.state.dialect == "capacity-text"
    clock.advance(25)
    s = sim.state("m")
    assert (s.slots, s.dialect, s.phase) == (6, "openai-503", 1)
    clock.advance(15)  # t = 60: a brownout phase triples service time
    admitted = ask(sim)
    assert isinstance(admitted, Admitted) and admitted.ticket.service_time == pytest.approx(3 * 2.0)
    assert sim.state("m").hint == 2.0
    clock.advance(61)  # t = 121 -> 1 in the second loop: back to the model's own values
    assert sim.state("m").phase is None and sim.state("m").slots == 6
    clock.advance(20)  # t = 141 -> 21: the outage again
    assert sim.state("m").slots == 0


def test_without_repeat_the_last_phase_stays() -> None:
    sim, clock = make_sim(slots=6, schedule=(Phase(at=5, slots=1),))
    clock.advance(10_000)
    assert sim.state("m").slots == 1


def test_admin_overrides_win_until_reset_schedule() -> None:
    sim, clock = make_sim(slots=6, schedule=(Phase(at=10, slots=3),))
    s = sim.configure("m", slots=0, hint=4.0, dialect="gemini-429", latency_factor=2.0)
    assert (s.slots, s.hint, s.dialect, s.latency_factor) == (0, 4.0, "gemini-429", 2.0)
    assert s.overrides == ("dialect", "hint", "latency_factor", "slots")
    clock.advance(20)
    assert sim.state("m").slots == 0  # override beats the schedule
    assert sim.configure("m", hint=None).hint is None  # null removes the hint
    s = sim.configure("m", reset_schedule=True)
    assert (s.slots, s.hint, s.dialect, s.overrides) == (3, None, "openai-503", ())
    with pytest.raises(ValueError, match="slots"):
        sim.configure("m", slots=-1)
    with pytest.raises(ValueError, match="dialect"):
        sim.configure("m", dialect="klingon-418")
    with pytest.raises(KeyError):
        sim.configure("nope", slots=1)


def test_outage_lasts_its_duration() -> None:
    sim, clock = make_sim(slots=6)
    s = sim.outage("m", 30, dialect="capacity-text")
    assert (s.slots, s.dialect, s.outage_for) == (0, "capacity-text", 30)
    assert isinstance(ask(sim), NoCapacity)
    clock.advance(29.9)
    assert sim.state("m").slots == 0
    clock.advance(0.2)
    s = sim.state("m")
    assert (s.slots, s.dialect, s.outage_for) == (6, "openai-503", 0)


# ---------------------------------------------------------------- penalty


def test_penalty_for_hammering_after_rejection() -> None:
    sim, clock = make_sim(slots=0, penalty=PenaltySpec(enabled=True, threshold=3, window=10, duration=30))
    assert isinstance(ask(sim), NoCapacity)  # the rejection that starts the count
    for _ in range(3):
        clock.advance(1)
        assert isinstance(ask(sim), NoCapacity)
    clock.advance(1)
    p = ask(sim)  # the 4th request within 10 s of a rejection
    assert p == Penalised(30)
    clock.advance(10)
    # every request from the key, to any model, is refused while penalised
    assert ask(sim, "other") == Penalised(20)
    clock.advance(20.5)
    assert isinstance(ask(sim, "other"), Admitted)
    stats = sim.stats()
    alias = key_alias(KEY)
    assert stats["keys"][alias]["penalised"] == 2
    assert stats["keys"][alias]["rejected"]["rate_limited"] == 2
    assert stats["totals"]["rejected"]["capacity"] == 4


def test_a_patient_client_is_not_penalised() -> None:
    sim, clock = make_sim(slots=0, penalty=PenaltySpec(enabled=True, threshold=3, window=10, duration=30))
    for _ in range(20):
        assert isinstance(ask(sim), NoCapacity)
        clock.advance(4)  # 3 requests per 10 s at most
    # ... and falling back to another model is not hammering
    assert isinstance(ask(sim), NoCapacity)
    for _ in range(5):
        assert isinstance(ask(sim, "other"), Admitted)


def test_penalty_is_off_by_default() -> None:
    sim, _ = make_sim(slots=0)
    for _ in range(100):
        assert isinstance(ask(sim), NoCapacity)


def test_penalty_is_per_key() -> None:
    keys = (KEY, "sk-other")
    sim, _ = make_sim(slots=0, keys=keys, penalty=PenaltySpec(enabled=True, threshold=2, window=10, duration=30))
    for _ in range(3):
        ask(sim)
    assert isinstance(ask(sim), Penalised)
    assert isinstance(ask(sim, key="sk-other"), NoCapacity)


# ---------------------------------------------------------------- keys and counters


def test_auth_and_stats_never_show_raw_keys() -> None:
    sim, _ = make_sim(slots=1)
    assert sim.authenticate("sk-wrong") is None
    assert sim.authenticate(None) is None
    a = ask(sim)
    assert isinstance(a, Admitted)
    ask(sim)
    stats = sim.stats()
    text = json.dumps(stats)
    assert KEY not in text and "sk-wrong" not in text
    totals = stats["totals"]
    assert totals["requests"] == 4
    assert totals["rejected"] == {"capacity": 1, "rate_limited": 0, "auth": 2, "bad_request": 0}
    assert (totals["accepted"], totals["in_flight"]) == (1, 1)
    mine = stats["keys"][key_alias(KEY)]
    assert (mine["requests"], mine["accepted"], mine["in_flight"]) == (2, 1, 1)
    model = stats["models"]["m"]
    assert (model["slots"], model["free"], model["in_flight"]) == (1, 0, 1)
    sim.release(a.ticket, completed=False)
    sim.reset_counters()
    stats = sim.stats()
    assert stats["totals"]["requests"] == 0 and stats["totals"]["cancelled"] == 0


def test_reset_counters_keeps_live_requests() -> None:
    sim, _ = make_sim(slots=3)
    a = ask(sim)
    assert isinstance(a, Admitted)
    sim.reset_counters()
    assert sim.stats()["totals"]["in_flight"] == 1
    sim.release(a.ticket)
    totals = sim.stats()["totals"]
    assert (totals["in_flight"], totals["completed"]) == (0, 1)


def test_wildcard_accepts_any_key() -> None:
    sim, _ = make_sim(keys=("*",))
    assert sim.authenticate("anything") == key_alias("anything")
    assert sim.authenticate("") is None


# ---------------------------------------------------------------- faults


def test_faults_take_no_slot_and_run_out() -> None:
    sim, _ = make_sim(slots=1)
    sim.faults.set(parse_rules({"mode": "truncate", "count": 2}))
    first = ask(sim)
    assert isinstance(first, Faulted) and first.mode is FaultMode.TRUNCATE
    assert isinstance(ask(sim), Faulted)
    assert isinstance(ask(sim), Admitted)  # the fault ran out, and faults held no slot
    assert sim.stats()["totals"]["faults"] == 2


def test_fault_rules_filter_by_model_and_stream() -> None:
    inj = FaultInjector()
    rng = random.Random(0)
    inj.set(parse_rules([{"mode": "stream_cut", "count": 1}, {"mode": "html_500", "count": 1, "model": "b"}]))
    assert inj.take("a", False, rng) is None  # plain requests do not use up a stream_cut
    assert inj.take("b", False, rng) is FaultMode.HTML_500
    assert inj.take("a", True, rng) is FaultMode.STREAM_CUT
    assert inj.take("a", True, rng) is None and inj.snapshot() == []


def test_fault_rate() -> None:
    inj = FaultInjector()
    inj.set((FaultRule(FaultMode.RESET, rate=0.25),))
    rng = random.Random(1)
    hits = sum(inj.take("m", False, rng) is not None for _ in range(2000))
    assert 400 < hits < 600


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"mode": "explode"}, "unknown fault mode"),
        ({"mode": "reset", "count": 0}, "count"),
        ({"mode": "reset", "rate": 2}, "rate"),
        ({"mode": "reset", "count": 1, "rate": 0.5}, "exactly one"),
        ({"mode": "reset", "cnt": 1}, "unknown fault field"),
        ("reset", "expected"),
    ],
)
def test_bad_fault_rules(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rules(raw)


def test_fault_off() -> None:
    assert parse_rules({"mode": "off"}) == ()


# ---------------------------------------------------------------- scenarios


def test_bundled_scenarios_load() -> None:
    names = bundled_scenarios()
    assert {"demo", "steady", "peak-hours", "outage", "brownout"} <= set(names)
    for name in names:
        s = load_scenario(name)
        assert s.name == name
        # every bundled scenario serves the shipped config's models, its Google and AWS deployments included
        assert {m.name for m in s.models} == {
            "sim-flagship",
            "sim-claude",
            "sim-medium",
            "sim-gemini-flash",
            "sim-claude-vertex",
            "us.anthropic.sim-claude-v1:0",
            "sim-small",
        }
        apis = {m.name: m.api for m in s.models}
        assert apis["sim-claude"] == "anthropic" and apis["us.anthropic.sim-claude-v1:0"] == "bedrock"
        assert SIMULATOR_DEMO_KEY in s.keys


def test_demo_flagship_goes_out_and_comes_back() -> None:
    clock = ManualClock()
    sim = Simulator(load_scenario("demo"), clock)
    sim.start()
    assert sim.state("sim-flagship").slots == 6
    clock.advance(15)
    assert sim.state("sim-flagship").slots == 0
    clock.advance(20)
    assert sim.state("sim-flagship").slots == 6
    clock.advance(100)  # 135 s -> 15 s into the second loop
    assert sim.state("sim-flagship").slots == 0


def test_outage_and_brownout_scenarios() -> None:
    clock = ManualClock()
    outage = Simulator(load_scenario("outage"), clock)
    outage.start()
    brown = Simulator(load_scenario("brownout"), clock)
    brown.start()
    clock.advance(6)
    assert outage.state("sim-flagship").slots == 0
    clock.advance(10)
    s = brown.state("sim-flagship")
    assert (s.slots, s.latency_factor) == (4, 3.0)
    clock.advance(60)
    assert outage.state("sim-flagship").slots == 8
    assert brown.state("sim-flagship").slots == 8


MINIMAL = """
[[models]]
name = "sim-x"
"""


def test_defaults() -> None:
    s = parse_scenario(MINIMAL)
    assert s.name == "custom" and s.models[0] == ModelSpec(name="sim-x")
    assert SIMULATOR_DEMO_KEY in s.keys and not s.penalty.enabled


@pytest.mark.parametrize(
    "text, key, message",
    [
        ("", "models", "at least one"),
        (MINIMAL + 'dialect = "klingon"\n', "models[0].dialect", "expected one of openai-429"),
        (MINIMAL + "slots = -1\n", "models[0].slots", ">= 0"),
        (MINIMAL + "slot = 3\n", "models[0].slot", "did you mean 'slots'"),
        (MINIMAL + 'noise = "lots"\n', "models[0].noise", "expected a finite number"),
        (MINIMAL + "noise = 2\n", "models[0].noise", "<= 1"),
        (
            MINIMAL + "[[models.schedule]]\nat = 10\n[[models.schedule]]\nat = 5\n",
            "models[0].schedule[1].at",
            "time order",
        ),
        (MINIMAL + "[[models.schedule]]\nslots = 1\n", "models[0].schedule[0].at", "missing"),
        ("repeat = 60\n" + MINIMAL + "[[models.schedule]]\nat = 60\n", "models[0].schedule[0].at", "less than repeat"),
        (MINIMAL + '[[models]]\nname = "sim-x"\n', "models[1].name", "duplicate"),
        ("keys = []\n" + MINIMAL, "keys", "non-empty list"),
        ("[penalty]\nthreshold = 0\n" + MINIMAL, "penalty.threshold", ">= 1"),
        ("seeds = 1\n" + MINIMAL, "seeds", "did you mean 'seed'"),
        ("name = \n", "", "not valid TOML"),
    ],
)
def test_scenario_errors_name_file_and_key(text: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_scenario(text, "my.toml")
    assert info.value.file == "my.toml"
    assert info.value.key == key
    assert message in str(info.value)


def test_unknown_scenario_name(tmp_path) -> None:
    with pytest.raises(ConfigError, match="bundled: .*demo"):
        load_scenario("no-such-scenario")
    path = tmp_path / "mine.toml"
    path.write_text(MINIMAL)
    assert load_scenario(str(path)).name == "mine"
    path.write_text(MINIMAL + "hint = -1\n")
    with pytest.raises(ConfigError, match=r"mine\.toml: models\[0\]\.hint"):
        load_scenario(path)


def test_an_outage_must_be_finite() -> None:
    import math

    sim = Simulator(load_scenario("steady"), ManualClock())
    sim.start()
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match="finite number of seconds"):
            sim.outage("sim-flagship", bad)
    assert sim.stats()["models"]  # the admin view still renders
