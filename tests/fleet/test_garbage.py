"""Garbage in Redis is a fault, not a crash (issue 16, item 4), against a real
redis-server: every value the fleet reads is parsed strictly (capmon/fleet/codec.py);
a bad one degrades the process that met it, is named once, repaired from what the
process knows, and the fleet is healthy again within 5 s; no request is lost or
answered with an error; no background task dies; forged leases do not fill a target."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis

from capmon.core.control.breaker import State
from capmon.core.routing.client import FallbackClient
from capmon.fleet import RedisState
from tests.fleet.helpers import FLAGSHIP, client, fleet_config, store, until
from tests.support.scripted import Reply, Script, ok, serve

HEALTHY_WITHIN = 5.0


@pytest.fixture
def admin(redis_url: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_url, socket_timeout=2.0, decode_responses=True)
    yield r
    r.close()


def _healthy(*cs: FallbackClient) -> bool:
    return all(store(c).link.ok for c in cs)


def _script() -> Script:
    script = Script()
    for m in ("flagship", "medium"):
        script.always(m, Reply(200, ok(m).body, delay=0.005))
    return script


@contextlib.asynccontextmanager
async def _two(redis_url: str, namespace: str, script: Script) -> AsyncIterator[tuple[FallbackClient, FallbackClient]]:
    """Two processes of one fleet on the scripted upstream, each with one request served."""
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace)
        async with client(cfg) as a, client(cfg) as b:
            await a.chat("hi")
            await b.chat("hi")
            yield a, b


async def _load(cs: tuple[FallbackClient, ...], seconds: float, models: list[str], each: int = 6) -> None:
    """Requests from every process for ``seconds``, and at least ``each`` per worker (so a
    loaded machine makes no fewer than the test counts on): each must be answered (an
    error raises)."""
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds

    async def worker(c: FallbackClient) -> None:
        done = 0
        while loop.time() < stop or done < each:
            models.append((await c.chat("hi")).model)
            done += 1

    await asyncio.gather(*(worker(c) for c in cs for _ in range(3)))


# ------------------------------------------------------------ the five failures of the issue


async def test_a_bogus_breaker_state_answers_every_request_and_is_repaired_within_5_s(
    redis_url: str, namespace: str, admin: redis.Redis, caplog: Any
) -> None:
    # main: every request raised ValueError ("'bogus' is not a valid State"), and the supervisor died
    caplog.set_level(logging.WARNING, logger="capmon.fleet")
    async with _two(redis_url, namespace, _script()) as (a, b):
        key = f"{namespace}:t:{{{FLAGSHIP}}}"
        admin.hset(key, "state", "bogus")
        t0 = time.perf_counter()
        models: list[str] = []
        await _load((a, b), 1.0, models)  # every request answered: none raises
        await until(lambda: _healthy(a, b) and admin.hget(key, "state") == "closed", timeout=HEALTHY_WITHIN)
        took = time.perf_counter() - t0
        assert store(a).link.losses + store(b).link.losses >= 1  # it was a fault: degraded, visibly
        assert store(a).supervisor.task("heartbeat") is not None
        assert (await a.chat("hi")).model == "flagship"
    assert len(models) > 30 and set(models) <= {"flagship", "medium"}
    assert took < HEALTHY_WITHIN
    named = [r.getMessage() for r in caplog.records if "bogus" in r.getMessage()]
    assert 1 <= len(named) <= 4, named  # named once per process (and once per repair), not at every sighting


async def test_a_budget_of_abc_degrades_for_a_moment_and_both_processes_are_healthy_again(
    redis_url: str, namespace: str, admin: redis.Redis
) -> None:
    # main: both processes stayed degraded, even after the value was fixed
    async with _two(redis_url, namespace, _script()) as (a, b):
        await until(lambda: admin.exists(f"{namespace}:budget") == 1)
        admin.hset(f"{namespace}:budget", "balance", "abc")
        t0 = time.perf_counter()
        await until(lambda: store(a).link.losses + store(b).link.losses >= 1, timeout=2.0)
        await until(lambda: _healthy(a, b), timeout=HEALTHY_WITHIN)
        took = time.perf_counter() - t0
        assert float(admin.hget(f"{namespace}:budget", "balance") or "nan") >= 0  # re-seeded from the mirror
        assert (await b.chat("hi")).model == "flagship"
    assert took < HEALTHY_WITHIN


async def test_a_malformed_message_is_skipped_and_trips_still_arrive_by_pubsub(
    redis_url: str, namespace: str, admin: redis.Redis
) -> None:
    # main: one such message killed every listener; trips then took 0.5 s (the reconciliation)
    async with serve(Script()) as url:
        cfg = fleet_config(url, redis_url, namespace)
        cfg = dataclasses.replace(cfg, shared=dataclasses.replace(cfg.shared, reconcile=30.0))
        async with client(cfg) as a, client(cfg) as b:
            await a.chat("hi")
            await b.chat("hi")
            sb = store(b)
            listener = sb._listen_task
            channel = f"{namespace}:events"
            for bad in MALFORMED_MESSAGES:
                admin.publish(channel, bad)
            await asyncio.sleep(0.1)
            assert sb._listen_task is listener and listener is not None and not listener.done()
            heard = sb.messages
            t0 = time.perf_counter()
            a.trip("flagship")
            took = await until(lambda: b.target(FLAGSHIP).state.view().breaker.state is State.FORCED_OPEN, timeout=1.0)
            assert sb.messages > heard  # by a message, not by the (30 s) reconciliation
            assert sb.link.ok and store(a).link.ok  # a message is not a key: nothing to degrade for
    assert took < 0.1, time.perf_counter() - t0


async def test_a_string_where_a_hash_belongs_is_replaced_and_the_process_rejoins(
    redis_url: str, namespace: str, admin: redis.Redis
) -> None:
    # main: WRONGTYPE at every reconciliation: degraded until a person deleted the key
    async with _two(redis_url, namespace, _script()) as (a, b):
        key = f"{namespace}:t:{{{FLAGSHIP}}}"
        admin.delete(key)
        admin.set(key, "not a hash")
        t0 = time.perf_counter()
        models: list[str] = []
        await _load((a, b), 0.5, models)
        await until(lambda: _healthy(a, b) and admin.type(key) == "hash", timeout=HEALTHY_WITHIN)
        took = time.perf_counter() - t0
        assert (await a.chat("hi")).model == "flagship"
    assert took < HEALTHY_WITHIN and models


async def test_100_forged_far_future_leases_do_not_keep_a_target_full(
    redis_url: str, namespace: str, admin: redis.Redis
) -> None:
    # main: the target stayed "full" for ever; every request went to medium
    async with serve(Script()) as url:
        cfg = fleet_config(url, redis_url, namespace, flagship="max_concurrency = 4")
        async with client(cfg) as a:
            await a.chat("hi")
            leases = f"{namespace}:t:{{{FLAGSHIP}}}:leases"
            redis_now = float(admin.time()[0])
            admin.zadd(leases, {f"forged#{i}": redis_now + 10**6 for i in range(100)})
            store(a).target(FLAGSHIP).slot_freed()  # the mirror's "full" nap is not what is tested
            models = [(await a.chat("hi")).model for _ in range(5)]
            left = admin.zcard(leases)
    assert models == ["flagship"] * 5
    assert left == 0  # removed by the scripts


# ------------------------------------------------------------ supervision


@pytest.mark.parametrize("how", ["cancel", "raise"])
async def test_every_background_task_comes_back_when_killed(
    redis_url: str, namespace: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serve(Script()) as url:
        cfg = fleet_config(url, redis_url, namespace)
        async with client(cfg) as a, client(cfg) as b:
            await a.chat("hi")
            sa = store(a)
            for name in ("heartbeat", "reconciliation", "listener", "rejoin"):
                old = sa.supervisor.task(name)
                assert old is not None and not old.done(), name
                if how == "cancel":
                    old.cancel()
                else:
                    _raise_once(monkeypatch, sa, name)
                await until(lambda n=name, o=old: _alive(sa, n, o), timeout=2.0)
                assert sa.supervisor.restarts[name] >= 1, name
            await until(lambda: sa.link.ok and sa._listen_task is not None, timeout=HEALTHY_WITHIN)
            # and each does its work again
            beats, checks = sa.link.calls["heartbeat"], sa.link.calls["reconcile"]
            await until(lambda: sa.link.calls["heartbeat"] > beats and sa.link.calls["reconcile"] > checks)
            heard = sa.messages
            b.trip("flagship")
            await until(lambda: sa.messages > heard)
            # and the rejoin task still rejoins
            sa.lost(ConnectionError("told so by the test"))
            await until(lambda: sa.link.ok, timeout=HEALTHY_WITHIN)


def _alive(state: RedisState, name: str, old: asyncio.Task[Any]) -> bool:
    task = state.supervisor.task(name)
    return task is not None and task is not old and not task.done()


def _raise_once(monkeypatch: pytest.MonkeyPatch, state: RedisState, name: str) -> None:
    """Make the task ``name`` raise something no handler expects, once."""
    attr = {"heartbeat": "_heartbeat", "reconciliation": "_reconcile", "rejoin": "_repair_all"}.get(name)
    if name == "listener":
        assert state._pubsub is not None
        real_get = state._pubsub.get_message

        async def broken(*args: Any, **kw: Any) -> Any:
            monkeypatch.setattr(state._pubsub, "get_message", real_get)
            raise RuntimeError("a bug in the listener")

        monkeypatch.setattr(state._pubsub, "get_message", broken)
        return
    assert attr is not None
    real = getattr(state, attr)

    async def once(*args: Any, **kw: Any) -> Any:
        monkeypatch.setattr(state, attr, real)
        raise RuntimeError(f"a bug in {name}")

    monkeypatch.setattr(state, attr, once)
    if name == "rejoin":
        state.lost(ConnectionError("so that the rejoin task runs"))


# ------------------------------------------------------------ every key type and channel, under load

# A mix of what can go wrong in a message: not JSON, not an object, no kind, wrong
# types in every field, a hash with garbage, binary, deep nesting.
MALFORMED_MESSAGES: list[str | bytes] = [
    "",
    "not json",
    "[]",
    "null",
    "42",
    '"x"',
    "{}",
    '{"k": "nope"}',
    '{"k": "b"}',
    '{"k": "b", "h": []}',
    '{"k": "b", "h": "x"}',
    '{"k": "b", "h": {"id": "flagship@ep/a", "gen": "x"}}',
    '{"k": "b", "h": {"id": "flagship@ep/a", "gen": "1", "state": "bogus"}}',
    '{"k": "b", "h": {"id": "flagship@ep/a", "gen": "1", "limit": "nan"}, "disabled": 3}',
    '{"k": "b", "h": {"id": 7, "gen": 1}}',
    '{"k": "freed"}',
    '{"k": "freed", "id": ["x"]}',
    '{"k": "pin", "model": {"a": 1}}',
    '{"k": "pin", "model": "x\\u0000y"}',
    '{"k": "lesson"}',
    '{"k": "lesson", "d": "flagship@ep|teleport", "why": "x"}',
    '{"k": "lesson", "d": "flagship@ep|tools", "why": ["x"]}',
    '{"k": 1}',
    b"\xff\xfe\x00",
    "[" * 5000 + "]" * 5000,
]


def _target(ns: str) -> str:
    return f"{ns}:t:{{{FLAGSHIP}}}"


# (name, the key it goes in, how it is written): each a value or type no capmon process writes
GARBAGE: list[tuple[str, Callable[[str], str], Callable[[redis.Redis, str], Any]]] = [
    ("target field", _target, lambda r, k: r.hset(k, mapping={"gen": "x", "limit": "inf", "next_probe": "nan"})),
    ("target state", _target, lambda r, k: r.hset(k, "state", "bogus")),
    ("target id", _target, lambda r, k: r.hset(k, "id", "another@target/a")),
    ("target no generation", _target, lambda r, k: (r.delete(k), r.hset(k, "foo", "bar"))),
    ("target type", _target, lambda r, k: (r.delete(k), r.set(k, "x"))),
    ("leases type", lambda ns: f"{_target(ns)}:leases", lambda r, k: (r.delete(k), r.set(k, "x"))),
    ("waiting type", lambda ns: f"{_target(ns)}:waiting", lambda r, k: (r.delete(k), r.hset(k, "a", "b"))),
    ("rpm tokens", lambda ns: f"{_target(ns)}:rpm", lambda r, k: r.hset(k, mapping={"tokens": "-1e308", "at": "abc"})),
    ("rpm type", lambda ns: f"{_target(ns)}:rpm", lambda r, k: (r.delete(k), r.rpush(k, "x"))),
    ("tpm type", lambda ns: f"{_target(ns)}:tpm", lambda r, k: (r.delete(k), r.set(k, "x"))),
    ("key type", lambda ns: f"{ns}:key:ep/a", lambda r, k: (r.delete(k), r.set(k, "x"))),
    ("budget balance", lambda ns: f"{ns}:budget", lambda r, k: r.hset(k, mapping={"balance": "abc", "ver": "1.5"})),
    ("budget huge", lambda ns: f"{ns}:budget", lambda r, k: r.hset(k, "balance", "1e308")),
    ("budget type", lambda ns: f"{ns}:budget", lambda r, k: (r.delete(k), r.sadd(k, "x"))),
    ("pin type", lambda ns: f"{ns}:pin", lambda r, k: (r.delete(k), r.hset(k, "a", "b"))),
    ("pin value", lambda ns: f"{ns}:pin", lambda r, k: r.set(k, "medium\x00\x07")),
    ("lessons field", lambda ns: f"{ns}:lessons", lambda r, k: r.hset(k, "flagship@ep|teleport", "x")),
    ("lessons type", lambda ns: f"{ns}:lessons", lambda r, k: (r.delete(k), r.set(k, "x"))),
    ("registry type", lambda ns: f"{ns}:procs", lambda r, k: (r.delete(k), r.set(k, "x"))),
    ("registry entry", lambda ns: f"{ns}:procs", lambda r, k: _bad_process(r, k)),
    ("meta type", lambda ns: f"{ns}:meta", lambda r, k: (r.delete(k), r.set(k, "x"))),
    ("events channel", lambda ns: f"{ns}:events", lambda r, k: [r.publish(k, m) for m in MALFORMED_MESSAGES]),
]


def _bad_process(r: redis.Redis, procs: str) -> None:
    """Another process's registry hash with garbage, and one of the wrong type."""
    ns = procs.removesuffix(":procs")
    for member in r.zrange(procs, 0, -1):
        r.hset(f"{ns}:proc:{member}", mapping={"pid": "abc", "role": "root"})
        break
    r.zadd(procs, {"ghost": float(r.time()[0]) + 3600})
    r.set(f"{ns}:proc:ghost", "x")


@pytest.mark.parametrize("name,where,write", GARBAGE, ids=[g[0] for g in GARBAGE])
async def test_garbage_in_every_key_and_channel_loses_no_request_and_heals_within_5_s(
    redis_url: str,
    namespace: str,
    admin: redis.Redis,
    name: str,
    where: Callable[[str], str],
    write: Callable[[redis.Redis, str], Any],
) -> None:
    script = _script()
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace, flagship="rpm = 100000\ntpm = 100000000")
        async with client(cfg) as a, client(cfg) as b:
            a.pin("flagship")  # the pin is a key too
            await a.chat("hi")
            await b.chat("hi")
            await until(lambda: admin.exists(f"{namespace}:budget", f"{_target(namespace)}:rpm") == 2)
            await until(lambda: b.pinned == "flagship")
            models: list[str] = []
            load = asyncio.ensure_future(_load((a, b), 0.5, models))
            await asyncio.sleep(0.1)
            write(admin, where(namespace))
            t0 = time.perf_counter()
            await load  # every request answered: an error or a 500-worthy exception raises here
            await until(lambda: _healthy(a, b) and _clean(admin, namespace), timeout=HEALTHY_WITHIN)
            took = time.perf_counter() - t0
            for c in (a, b):
                for task in ("heartbeat", "reconciliation", "rejoin", "listener"):
                    t = store(c).supervisor.task(task)
                    assert t is not None and not t.done(), (name, task)
            assert (await b.chat("hi")).model == "flagship"
    assert len(models) > 30 and set(models) <= {"flagship", "medium"}
    assert len(models) + 3 == script.served()  # none lost
    assert took < HEALTHY_WITHIN


def _clean(r: redis.Redis, ns: str) -> bool:
    """Every key of the namespace has the type and the values a capmon process writes."""
    want = {
        _target(ns): "hash",
        f"{_target(ns)}:leases": "zset",
        f"{_target(ns)}:waiting": "zset",
        f"{_target(ns)}:rpm": "hash",
        f"{_target(ns)}:tpm": "hash",
        f"{ns}:key:ep/a": "hash",
        f"{ns}:budget": "hash",
        f"{ns}:pin": "string",
        f"{ns}:lessons": "hash",
        f"{ns}:procs": "zset",
        f"{ns}:meta": "hash",
    }
    for key, kind in want.items():
        if r.type(key) not in (kind, "none"):
            return False
    h = r.hgetall(_target(ns))
    if h.get("state") not in {s.value for s in State} or not h.get("gen", "").isdigit():
        return False
    if h.get("id") != FLAGSHIP or h.get("limit") in ("inf", "nan"):
        return False
    balance = r.hget(f"{ns}:budget", "balance")
    if balance is not None and not (0 <= float(balance) <= 100):
        return False
    if r.type(f"{ns}:lessons") == "hash" and any("teleport" in f for f in r.hkeys(f"{ns}:lessons")):
        return False
    return r.get(f"{ns}:pin") in (None, "flagship", "medium")


def test_the_garbage_cases_cover_every_key_the_scripts_name() -> None:
    """Every key kind in capmon/fleet/scripts.py has a garbage case above."""
    from capmon.fleet.scripts import Keys

    keys = Keys("ns")
    props = [
        keys.events,
        keys.pin,
        keys.budget,
        keys.lessons,
        keys.procs,
        keys.meta,
        keys.target("T"),
        keys.leases("T"),
        keys.rpm("T"),
        keys.tpm("T"),
        keys.waiting("T"),
        keys.key(("ep", "a")),
    ]
    covered = {w("ns").replace(FLAGSHIP, "T") for _, w, _ in GARBAGE}
    assert set(props) <= covered, set(props) - covered  # and proc:<id>: the "registry entry" case
