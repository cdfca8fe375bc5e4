"""Routing details: pinning, lean requests, too_large, keys, deadlines, streaming, budgets."""

from __future__ import annotations

import asyncio

import pytest

from capmon.core.base.exceptions import CannotWait, DeadlineExceeded, RequestFailed, Unavailable
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.failure import Kind
from capmon.core.types.result import Decision, Request, Skip, sent
from capmon.sim.app import create_app
from capmon.sim.scenario import parse_scenario
from tests.support.configs import ENV, THREE_MODELS, build_config, three_models
from tests.support.scripted import OVERLOADED, Reply, Script, ok, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]


async def test_a_pinned_model_wins_over_the_order_and_unpinning_goes_back() -> None:
    script = Script()
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            client.pin("small")
            assert (await client.chat("a")).model == "small"
            client.pin(None)
            assert (await client.chat("b")).model == "flagship"
            with pytest.raises(Exception, match="no model or deployment named 'huge'"):
                client.pin("huge")


async def test_requests_are_kept_lean_the_callers_max_tokens_kept_and_n_1() -> None:
    script = Script()
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            kept = await client.chat(Request.of("hi", max_tokens=99999, extra={"n": 5, "top_p": 0.5}))
            await client.chat(Request.of("hi"))
    body = script.seen[0].body
    assert body["max_tokens"] == 99999 and body["n"] == 1 and body["top_p"] == 0.5
    assert kept.max_tokens_lowered is None
    assert script.seen[1].body["max_tokens"] == 1024  # none given: the model's own max_tokens


async def test_with_cap_client_tokens_the_models_max_tokens_is_a_ceiling_and_the_result_says_so() -> None:
    script = Script()
    async with serve(script) as url:
        config = three_models(url, extra="[client]\ncap_client_tokens = true")
        async with FallbackClient(config, environ=ENV) as client:
            lowered = await client.chat(Request.of("hi", max_tokens=99999))
            below = await client.chat(Request.of("hi", max_tokens=10))
    assert [s.body["max_tokens"] for s in script.seen] == [1024, 10]
    assert lowered.max_tokens_lowered == 1024 and below.max_tokens_lowered is None


async def test_too_large_falls_back_only_to_a_model_whose_window_is_larger() -> None:
    script = Script()
    too_large = Reply(
        400,
        {
            "error": {
                "message": "This model's maximum context length is 16000 tokens.",
                "code": "context_length_exceeded",
            }
        },
    )
    script.always("medium", too_large)
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            client.pin("medium")  # order: medium, then the request's own small, then flagship
            result = await client.chat(Request.of("long prompt", model="small"))
    assert result.model == "flagship"
    assert [a.kind for a in sent(result.attempts)] == [Kind.TOO_LARGE, None]
    assert script.served("small") == 0  # its window is smaller than the one that was too small
    # ... and the record says so
    assert [(a.model, a.skip) for a in result.skipped] == [("small", Skip.WINDOW)]
    assert "context window of 16,000 tokens is below" in result.skipped[0].reason


async def test_a_prompt_larger_than_every_window_fails_without_sending() -> None:
    script = Script()
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            with pytest.raises(CannotWait) as info:  # at once: no wait can make a window larger
                await client.chat("x" * 4 * 130_000)
    assert info.value.failure.kind is Kind.TOO_LARGE and script.served() == 0
    assert info.value.why is Unavailable.WINDOW


async def test_a_bad_request_fails_with_the_providers_message_and_no_retry() -> None:
    script = Script()
    script.always(
        "flagship",
        Reply(422, {"error": {"message": "messages[0].role must be one of system, user", "code": "invalid_value"}}),
    )
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            with pytest.raises(RequestFailed, match="must be one of"):
                await client.chat("hi")
    assert script.served() == 1


async def test_rate_limited_moves_to_another_key_of_the_same_model_at_once() -> None:
    script = Script()
    limited = Reply(
        429,
        {"error": {"message": "Rate limit reached for requests", "code": "rate_limit_exceeded"}},
        headers={"retry-after": "20"},
    )
    script.set("flagship", lambda n, body: limited if script.seen[-1].key == ENV["TEST_KEY_A"] else ok("flagship"))
    keys = '[{ env = "TEST_KEY_A", alias = "a" }, { env = "TEST_KEY_B", alias = "b" }]'
    async with serve(script) as url:
        async with FallbackClient(three_models(url, keys=keys), environ=ENV) as client:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            first = await client.chat("hi")
            second = await client.chat("again")  # key a is still inside its hint: b serves at once
            assert loop.time() - t0 < 1.0
    assert first.model == "flagship" and first.target.endswith("/b")
    assert second.attempts[0].target.endswith("/b") and len(second.attempts) == 1


async def test_a_transient_error_is_retried_after_a_short_backoff() -> None:
    script = Script()
    script.set(
        "flagship",
        lambda n, body: Reply(502, "<html><body><h1>502 Bad Gateway</h1><hr>nginx</body></html>")
        if n == 1
        else ok("flagship"),
    )
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            result = await client.chat("hi")
    assert result.model == "flagship" and result.attempts[0].kind is Kind.TRANSIENT
    assert result.attempts[0].decision == "retry" and result.attempts[0].wait <= 5.0


async def test_the_retry_budget_stops_hammering_a_failing_server() -> None:
    script = Script()
    for name in ("flagship", "medium", "small"):
        script.always(name, Reply(500, {"error": {"message": "internal error"}}))
    async with serve(script) as url:
        async with FallbackClient(three_models(url, extra="[client]\nretry_budget = 0.1"), environ=ENV) as client:
            failures = 0
            for i in range(50):
                try:
                    await client.chat(f"item {i}")
                except RequestFailed as e:
                    assert e.failure.kind is Kind.TRANSIENT
                    failures += 1
    assert failures == 50
    # 50 first attempts plus a budget of at most 10 + 0.1 * 50 retries.
    assert script.served() <= 50 + 10 + 5 + 1


async def test_the_deadline_bounds_a_request_when_nothing_ever_admits_it() -> None:
    script = Script()
    for name in ("flagship", "medium", "small"):
        script.always(name, OVERLOADED)
    async with serve(script) as url:
        cfg = three_models(url, extra="[client]\ndeadline = 120.0")
        async with FallbackClient(cfg, environ=ENV) as client:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(DeadlineExceeded) as info:
                await client.chat("hi")
            assert 120.0 <= loop.time() - t0 < 130.0
    assert info.value.failure.kind is Kind.CAPACITY


async def test_waiting_retries_show_in_the_snapshot_with_their_deadline() -> None:
    script = Script()
    for name in ("flagship", "medium", "small"):
        script.set(name, lambda n, body: OVERLOADED if n == 1 else ok("x"))
    bus = ev.EventBus()
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV, bus=bus) as client:
            task = asyncio.create_task(client.chat("hi"))
            for _ in range(200):
                await asyncio.sleep(0.001)
                snap = client.snapshot()
                if snap.waiting:
                    break
            assert snap.waiting and snap.waiting[0].deadline > snap.now
            await task
    kinds = [type(e).__name__ for e in bus.recent()]
    assert "FellBack" in kinds and "RetryScheduled" in kinds and kinds[-1] == "RequestDone"


async def test_streaming_through_the_simulator() -> None:
    import httpx

    scenario = parse_scenario("""
name = "t"
[[models]]
name = "sim-flagship"
slots = 4
base_latency = 0.05
per_token = 0.001
answer_tokens = 40
""")
    app = create_app(scenario)
    cfg = three_models("http://sim/v1", extra="")
    cfg = cfg.__class__(
        **{
            **cfg.__dict__,
            "models": tuple(m.__class__(**{**m.__dict__, "api_model": "sim-flagship"}) for m in cfg.models),
        }
    )
    env = {"TEST_KEY_A": "sk-capmon-sim-demo"}
    async with FallbackClient(cfg, environ=env, transport=httpx.ASGITransport(app=app)) as client:
        pieces = [p async for p in client.stream("tell me")]
        result = await client.chat("tell me")
    assert len(pieces) > 3 and len("".join(pieces).split()) >= 20
    assert result.model == "flagship" and len(result.content.split()) >= 20


def _sim_config(slots: dict[str, int], latency: float = 0.5) -> tuple[object, object]:
    import httpx

    models = "".join(
        f"""
[[models]]
name = "sim-{name}"
slots = {n}
base_latency = {latency}
per_token = 0.0
noise = 0.0
dialect = "openai-503"
"""
        for name, n in slots.items()
    )
    app = create_app(parse_scenario('name = "t"\n' + models))
    cfg = build_config(
        "http://sim/v1",
        models={m: {**spec, "api_model": f"sim-{m}"} for m, spec in THREE_MODELS.items()},
        breaker={"cooldown": 300.0, "ramp_duration": 60.0},
    )
    return cfg, httpx.ASGITransport(app=app)


async def test_a_model_that_is_merely_full_is_not_tripped_the_limiter_queues_instead() -> None:
    cfg, transport = _sim_config({"flagship": 4, "medium": 4, "small": 64})
    env = {"TEST_KEY_A": "sk-capmon-sim-demo"}
    async with FallbackClient(cfg, environ=env, transport=transport) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        results = await asyncio.gather(*(client.chat(f"item {i}") for i in range(200)))
        wall = loop.time() - t0
        snap = client.snapshot()
    assert all(t.state == "closed" for t in snap.targets), [(t.model, t.state) for t in snap.targets]
    served = {m: sum(r.model == m for r in results) for m in ("flagship", "medium", "small")}
    # The flagship was kept busy: near its capacity of 4 slots x 2 answers a second.
    assert served["flagship"] >= 0.7 * wall * 8, (served, wall)
    rejected = sum(1 for r in results for a in r.attempts if a.kind is not None)
    assert rejected / len(results) < 0.15  # the limiter learns the slots; few doomed requests


async def test_a_hung_attempt_is_cut_by_the_per_attempt_timeout_and_left_as_a_silent_route() -> None:
    # No headers within the whole attempt: silent (issue 29 item 2), so the request falls over
    # at once rather than retrying the route (on the original code: a transient retry there).
    script = Script()
    script.set("flagship", lambda n, body: Reply(200, {}, delay=3600) if n == 1 else ok("flagship"))
    async with serve(script) as url:
        cfg = three_models(url, extra="[client]\nattempt_timeout = 5.0")
        async with FallbackClient(cfg, environ=ENV) as client:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            result = await client.chat("hi")
            assert loop.time() - t0 < 15
    first = result.attempts[0]
    assert first.kind is Kind.CAPACITY and first.reason == "no response headers within 5s: the route is silent"
    assert first.decision is Decision.FALLBACK and result.model == "medium"


async def test_an_rpm_bucket_paces_requests_instead_of_sending_them_to_be_rejected() -> None:
    script = Script()
    async with serve(script) as url:
        cfg = three_models(url)
        cfg = cfg.__class__(
            **{**cfg.__dict__, "models": (cfg.models[0].__class__(**{**cfg.models[0].__dict__, "rpm": 60}),)}
        )
        async with FallbackClient(cfg, environ=ENV) as client:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await asyncio.gather(*(client.chat(f"{i}") for i in range(70)))
            elapsed = loop.time() - t0
    # The bucket starts full (60) and refills at one a second: the last ten wait ~10 s.
    assert 8.0 <= elapsed <= 15.0
    assert script.served() == 70
