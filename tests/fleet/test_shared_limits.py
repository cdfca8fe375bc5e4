"""What one process learns or spends, every process has: auth-disabled keys, quota
parking, rpm / tpm buckets, the concurrency limit, the retry budget."""

from __future__ import annotations

import asyncio

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.control.seam import KeyState
from capmon.core.types.failure import Failure, Kind
from capmon.fleet.codec import KeyNews
from capmon.fleet.target import RedisTarget
from tests.fleet.helpers import FLAGSHIP, MEDIUM, client, fleet_config, store, until
from tests.support.configs import ENV
from tests.support.scripted import Reply, Script, ok, serve

TWO_KEYS = '[{ env = "TEST_KEY_A", alias = "a" }, { env = "TEST_KEY_B", alias = "b" }]'
UNAUTHORIZED = Reply(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
NO_QUOTA = Reply(
    429,
    {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }
    },
)


async def test_a_key_refused_in_one_process_is_disabled_in_every_process_for_every_model(
    redis_url: str, namespace: str
) -> None:
    script = Script()
    key_a = ENV["TEST_KEY_A"]
    for model in ("flagship", "medium"):
        script.set(model, lambda n, body, m=model: UNAUTHORIZED if script.seen[-1].key == key_a else ok(m))
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace, keys=TWO_KEYS)
        async with client(cfg) as a, client(cfg) as b:
            result = await a.chat("hi")
            assert result.target == "flagship@ep/b"  # key a refused: the other key
            on_b = [b.target(t).state for t in (FLAGSHIP, MEDIUM)]
            await until(lambda: all(t.view().key_state is KeyState.DISABLED for t in on_b), timeout=0.2)
            assert not any(t.usable() for t in on_b)
            before = sum(1 for s in script.seen if s.key == key_a)
            for _ in range(3):
                assert (await b.chat("hi")).target == "flagship@ep/b"
            assert sum(1 for s in script.seen if s.key == key_a) == before  # B never sent on key a
            a.reset(FLAGSHIP)  # a person clears it: for everyone
            await until(lambda: all(t.view().key_state is KeyState.OK for t in on_b), timeout=0.2)


async def test_a_model_out_of_quota_in_one_process_is_parked_in_every_process(redis_url: str, namespace: str) -> None:
    script = Script()
    script.always("flagship", NO_QUOTA)
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace)
        async with client(cfg) as a, client(cfg) as b:
            assert (await a.chat("hi")).model == "medium"
            tb = b.target(FLAGSHIP).state
            await until(lambda: tb.view().key_state is KeyState.PARKED, timeout=0.2)
            view = tb.view()
            assert view.key_until is not None and view.key_until - asyncio.get_running_loop().time() > 3000
            for _ in range(3):
                assert (await b.chat("hi")).model == "medium"
            assert script.served("flagship") == 1


@pytest.fixture
def patient_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis call slower than the link's timeout counts as Redis lost, and a process that
    degrades takes a fresh share of each bucket (capmon/fleet/target.py, ``go_local``): on a
    loaded machine that once served a fifth request of four a minute. These tests are about
    the shared bucket, so their calls may take seconds; losing Redis is tested elsewhere."""
    monkeypatch.setattr("capmon.fleet.link.COMMAND_TIMEOUT", 5.0)


@pytest.mark.usefixtures("patient_link")
async def test_the_rpm_bucket_is_the_fleets(redis_url: str, namespace: str) -> None:
    script = Script()
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace, flagship="rpm = 4")
        async with client(cfg) as a, client(cfg) as b:
            for _ in range(6):
                for c in (a, b):
                    await c.chat("hi")
            assert store(a).link.losses == store(b).link.losses == 0
    # Four requests a minute for the two together (each alone would have sent four)
    assert script.served("flagship") == 4
    assert script.served("medium") == 8


@pytest.mark.usefixtures("patient_link")
async def test_the_tpm_bucket_is_the_fleets(redis_url: str, namespace: str) -> None:
    script = Script()
    used = Reply(
        200, {**ok("flagship").body, "usage": {"prompt_tokens": 5, "completion_tokens": 395, "total_tokens": 400}}
    )
    script.always("flagship", used)
    async with serve(script) as url:
        # each request is charged about 300 tokens up front (its max_tokens), and uses 400: three fit in 1000
        cfg = fleet_config(url, redis_url, namespace, flagship="tpm = 1000\nmax_tokens = 300")
        async with client(cfg) as a, client(cfg) as b:
            for _ in range(4):
                for c in (a, b):
                    await c.chat("hi")
    assert script.served("flagship") == 3
    assert script.served("medium") == 5


async def test_the_concurrency_limit_is_the_fleets(redis_url: str, namespace: str) -> None:
    script = Script()
    script.always("flagship", Reply(200, ok("flagship").body, delay=0.15))
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace, flagship="max_concurrency = 2")
        async with client(cfg) as a, client(cfg) as b:
            results = await asyncio.gather(*(c.chat("hi") for c in (a, b) for _ in range(5)))
    starts = sorted(s.at for s in script.seen if s.model == "flagship")
    # at most two at once across both processes: the third start comes after the first answer
    overlap = max(sum(1 for t in starts if s <= t < s + 0.14) for s in starts)
    assert overlap <= 2, starts
    assert sum(1 for r in results if r.model == "flagship") == len(starts) >= 2
    assert sum(1 for r in results if r.model == "medium") >= 6


async def test_the_retry_budget_is_the_fleets(redis_url: str, namespace: str) -> None:
    script = Script()
    broken = Reply(500, {"error": {"message": "internal error"}})
    script.always("flagship", broken)
    script.always("medium", broken)
    async with serve(script) as url:
        cfg = fleet_config(
            url,
            redis_url,
            namespace,
            extra="""
[client]
retry_budget = 0.0
[backoff]
base = 0.001
cap = 0.002
transient_cap = 0.002
""",
        )
        async with client(cfg) as a, client(cfg) as b:
            with pytest.raises(RequestFailed, match="retry budget spent"):
                await a.chat("hi")
            assert script.served() == 11  # the first attempt and the ten retries the budget starts with
            await until(lambda: not store(a)._tasks)  # its spends have reached Redis
            with pytest.raises(RequestFailed, match="retry budget spent"):
                await b.chat("hi")
            assert script.served() == 12  # B found the budget spent: no retry of its own


async def test_a_read_of_a_key_from_before_a_disable_or_a_reset_cannot_undo_it(redis_url: str, namespace: str) -> None:
    # A reconciliation or a message read before this process's settle disabled the key (or
    # before its reset) may be applied after it: the key's version says it is older.
    cfg = fleet_config("http://127.0.0.1:9/v1", redis_url, namespace)
    auth = Failure(Kind.AUTH, "Incorrect API key provided", 401, "invalid_api_key")
    async with client(cfg) as a:
        flagship, medium = a.target(FLAGSHIP).state, a.target(MEDIUM).state
        assert isinstance(flagship, RedisTarget)
        adm = await flagship.admit(1)
        assert adm is not None
        await flagship.settle(adm, auth)
        flagship.apply_key(KeyNews("", 0))  # read before the disable
        assert flagship.view().key_state is KeyState.DISABLED and not medium.usable()
        a.reset(FLAGSHIP)
        flagship.apply_key(KeyNews(auth.reason, 1))  # read before the reset reached Redis
        assert flagship.view().key_state is KeyState.OK and medium.usable()
        await asyncio.gather(*store(a)._tasks)
        flagship.apply_key(KeyNews(auth.reason, 3))  # a newer disable, by another process
        assert not medium.usable()


async def test_a_model_s_targets_are_chosen_by_the_room_the_mirror_reads(redis_url: str, namespace: str) -> None:
    # One model on two keys (two targets) in a fleet: the room each has left is read from the
    # mirror (the fleet's limit, this process's in flight) without a round trip, and a burst
    # spreads over both (in the config's order it would all go to key a, whose limit is 8).
    script = Script()
    script.set("flagship", lambda n, body: Reply(200, ok("flagship").body, delay=0.05))
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace, keys=TWO_KEYS)
        async with client(cfg) as a:
            on_a, on_b = a.target("flagship@ep/a").state, a.target("flagship@ep/b").state
            assert isinstance(on_a, RedisTarget) and store(a).link.ok
            now = a.clock.now()
            assert on_a.room(now, 1) == on_b.room(now, 1) == 1.0
            adm = await on_a.admit(1)
            assert adm is not None and on_a.room(a.clock.now(), 1) == pytest.approx(7 / 8)
            await on_a.settle(adm, None, used_tokens=1)
            results = await asyncio.gather(*(a.chat("hi") for _ in range(6)))
    assert sorted(r.target for r in results) == ["flagship@ep/a"] * 3 + ["flagship@ep/b"] * 3
    assert all(r.fallbacks == 0 for r in results)
