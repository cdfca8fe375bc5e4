"""Fuzz (hypothesis) over the fleet's decoding of what it reads from Redis: a target's
hash, the registry, the budget, the pin, a script's answer, a pub/sub message. No
exception but the one typed :class:`~capmon.fleet.codec.Garbage` leaves a decoder, and
applying any message a decoder accepts never raises (so the listener cannot die)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capmon.core.base.clock import default_clock
from capmon.core.control.seam import TargetSpec
from capmon.fleet import codec
from capmon.fleet.codec import Garbage
from capmon.fleet.settings import resolve
from capmon.fleet.store import RedisState
from tests.fleet.helpers import FLAGSHIP, MEDIUM, fleet_config

# Values near the edges of what the scripts write, and plain junk.
NUMBERISH = st.one_of(
    st.integers(-(2**60), 2**60).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda x: f"{x:.17g}"),
    st.sampled_from(["", "nan", "inf", "-inf", "0x10", "1_0", " 3", "3 ", "1e999", "-0", ".5", "5.", "1e-5"]),
)
VALUE = st.one_of(NUMBERISH, st.text(max_size=20), st.sampled_from(["closed", "open", "ramp", "half-open", FLAGSHIP]))
FIELD = st.one_of(st.sampled_from(sorted(codec.TARGET_FIELDS)), st.text(max_size=8))
HASH = st.dictionaries(FIELD, VALUE, max_size=30)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def _message_shape(kind: str, h: dict[str, str], extra: dict[str, Any]) -> str:
    return json.dumps({"k": kind, "h": h, **extra})


MESSAGE = st.one_of(
    st.text(max_size=50),
    st.binary(max_size=50),
    JSONISH.map(json.dumps),
    st.builds(
        _message_shape,
        st.sampled_from(["b", "freed", "pin", "x"]),
        HASH.map(lambda h: {**h, "id": FLAGSHIP} if h else h),
        st.dictionaries(st.sampled_from(["id", "to", "model", "origin", "disabled"]), JSONISH, max_size=4),
    ),
)


def _only_garbage(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Garbage:
        pass


@settings(max_examples=400, deadline=None)
@given(HASH)
def test_a_target_hash_decodes_or_is_garbage(h: dict[str, str]) -> None:
    try:
        decoded = codec.target(h, "ns:t:{x}", FLAGSHIP)
    except Garbage as g:
        assert g.where == "ns:t:{x}"
        return
    if decoded is not None:  # what passes is what the core's types take
        decoded.record(offset=-3.5)
        decoded.learned()


@settings(max_examples=300, deadline=None)
@given(st.one_of(HASH, st.lists(st.text(max_size=8), max_size=9), JSONISH, JSONISH.map(json.dumps)))
def test_a_script_answers_hash_and_the_registry_decode_or_are_garbage(raw: Any) -> None:
    try:
        fields = codec.flat_hash(raw, "ns:procs")
    except Garbage:
        return
    _only_garbage(codec.process, fields, "ns:proc:x", "me")
    _only_garbage(codec.target, fields, "ns:t:{x}", None)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), VALUE, st.integers()), st.one_of(st.none(), VALUE), st.one_of(st.none(), VALUE))
def test_the_budget_and_the_pin_decode_or_are_garbage(balance: Any, ver: Any, pin: Any) -> None:
    _only_garbage(codec.budget, balance, ver, "ns:budget", 100.0)
    _only_garbage(codec.pin, pin, "ns:pin")
    _only_garbage(codec.key_disabled, pin, "ns:key:ep/a")


@settings(max_examples=400, deadline=None)
@given(MESSAGE)
def test_a_message_decodes_or_is_garbage(data: Any) -> None:
    _only_garbage(codec.message, data, "ns:events")


def _state() -> RedisState:
    cfg = fleet_config("http://127.0.0.1:9/v1", "redis://127.0.0.1:9/0", "fuzz")
    specs = [TargetSpec(t, cfg.model(t.split("@")[0]), ("ep", "a"), "a") for t in (FLAGSHIP, MEDIUM)]
    return RedisState(cfg, specs, default_clock(), lambda e: None, resolve(cfg))


STATE = _state()  # never started: messages are applied to its mirror only


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(MESSAGE, max_size=6))
def test_applying_any_message_never_raises(messages: list[Any]) -> None:
    for data in messages:
        STATE._on_message(data)  # what the listener calls for each message: it must not raise
    assert STATE.target(FLAGSHIP).view() is not None  # the mirror still answers
