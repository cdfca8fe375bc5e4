"""Faults from the server, on a real loopback simulator, in fast-forwarded time.

Each fault runs a batch of concurrent requests through one FallbackClient and checks
that every failed attempt was classified (kind and reason), retried or failed as its
kind says, and that every request was answered exactly once: one ChatResult per
request, one RequestDone event per request, and as many completions on the server as
answers (a faulted request takes no slot on the simulator, so nothing is served twice).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.failure import Kind
from capmon.core.types.result import ChatResult, sent
from capmon.sim.server import running_simulator, start_simulator
from tests.reliability.helpers import (
    ENV,
    Recorder,
    dead_url,
    scenario,
    set_fault,
    set_faults,
    sim_config,
    sim_stats,
)

pytestmark = pytest.mark.looptime

N = 40  # concurrent requests per run
FAULTS = 6  # faulted requests per run: well inside the retry budget (10 + 0.2 per request)


def done_events(rec: Recorder) -> list[ev.RequestDone]:
    return [e for e in rec.events if isinstance(e, ev.RequestDone)]


def check_all_answered(results: Sequence[Any], rec: Recorder, completed_on_server: int) -> list[ChatResult]:
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} of {len(results)} failed; first: {errors[0]!r}"
    done = done_events(rec)
    assert len(done) == len(results) and all(e.ok for e in done)
    assert len({e.request_id for e in done}) == len(results)  # each request answered once
    assert completed_on_server == len(results)  # nothing served twice
    return list(results)


def failed_attempts(results: Sequence[ChatResult]) -> list[Any]:
    return [a for r in results for a in r.attempts if a.kind is not None]


async def answer_or_error(client: FallbackClient, text: str) -> ChatResult | RequestFailed:
    try:
        return await client.chat(text)
    except RequestFailed as e:
        return e


async def run_batch(client: FallbackClient, n: int = N) -> list[Any]:
    return await asyncio.gather(*(client.chat(f"request {i}") for i in range(n)), return_exceptions=True)


# ---------------------------------------------------------------- one fault each


@pytest.mark.parametrize(
    ("mode", "status", "reason"),
    [
        pytest.param("reset", 200, "protocol error (RemoteProtocolError: peer closed connection", id="reset"),
        pytest.param("truncate", 200, '200 with a broken body (not JSON: {"id": "chatcmpl-', id="truncate"),
        pytest.param("invalid_json", 200, "200 with a broken body (not JSON: not json)", id="invalid_json"),
        pytest.param("html_500", 500, "500 Internal Server Error (nginx)", id="html_500"),
    ],
)
async def test_a_broken_answer_is_transient_and_retried_on_the_same_model(mode: str, status: int, reason: str) -> None:
    rec = Recorder(keep=True)
    async with running_simulator(scenario()) as sim:
        await set_fault(sim, mode=mode, count=FAULTS, model="sim-flagship")
        async with FallbackClient(sim_config(sim.base_url), environ=ENV, bus=ev.EventBus()) as client:
            client.bus.subscribe(rec)
            results = await run_batch(client)
        stats = await sim_stats(sim)
    results = check_all_answered(results, rec, stats["totals"]["completed"])
    assert stats["totals"]["faults"] == FAULTS
    failed = failed_attempts(results)
    assert len(failed) == FAULTS
    for a in failed:
        assert a.kind is Kind.TRANSIENT and a.decision == "retry" and a.model == "flagship"
        assert a.reason.startswith(reason), a.reason
        # a reset happens before the status line reaches the client; the others have one
        assert a.status == (None if mode == "reset" else status)
        assert 0.0 <= a.wait <= 5.0  # short backoff: [backoff] transient_cap
    assert sum(len(sent(r.attempts)) for r in results) == N + FAULTS
    assert rec.counts["AttemptFailed"] == FAULTS and rec.counts["RetryScheduled"] == FAULTS


async def test_a_hung_plain_attempt_is_cut_by_the_per_attempt_timeout_and_left_as_a_silent_route() -> None:
    # No response headers within the whole attempt's timeout (a plain answer's first token
    # comes whole, so [client] first_token_timeout does not apply): the route is silent,
    # never retried (issue 29 item 2); the request falls over at once.
    rec = Recorder(keep=True)
    async with running_simulator(scenario()) as sim:
        await set_fault(sim, mode="hang", count=FAULTS, model="sim-flagship")
        cfg = sim_config(sim.base_url, extra="[client]\nattempt_timeout = 30.0\n")
        async with FallbackClient(cfg, environ=ENV) as client:
            client.bus.subscribe(rec)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            results = await run_batch(client)
            elapsed = loop.time() - t0  # fake time: the simulator hangs for a day
        stats = await sim_stats(sim)
    results = check_all_answered(results, rec, stats["totals"]["completed"])
    failed = failed_attempts(results)
    assert len(failed) == FAULTS
    for a in failed:
        assert a.kind is Kind.CAPACITY and a.decision == "fallback" and a.status is None
        assert a.reason == "no response headers within 30s: the route is silent", a.reason
        assert a.latency == pytest.approx(30.0, abs=0.5)
    assert all(a.model != "flagship" for r in results for a in sent(r.attempts)[1:])  # never retried there
    assert 30.0 <= elapsed < 30.0 + 10.0  # one timeout, then the fallback's answer


async def test_a_stream_cut_before_any_text_is_retried() -> None:
    # 4 answer tokens make one SSE piece: the cut comes before it, so no text was sent.
    rec = Recorder(keep=True)
    async with running_simulator(scenario(answer_tokens=4)) as sim:
        await set_fault(sim, mode="stream_cut", count=FAULTS, model="sim-flagship")
        async with FallbackClient(sim_config(sim.base_url), environ=ENV) as client:
            client.bus.subscribe(rec)

            async def one(i: int) -> str:
                return "".join([piece async for piece in client.stream(f"request {i}")])

            texts = await asyncio.gather(*(one(i) for i in range(N)), return_exceptions=True)
        stats = await sim_stats(sim)
    errors = [t for t in texts if isinstance(t, BaseException)]
    assert not errors, errors[:1]
    assert all(len(t.split()) == 4 for t in texts)  # whole answers, nothing from the cut streams
    done = done_events(rec)
    assert len(done) == N and all(e.ok for e in done) and stats["totals"]["completed"] == N
    failed = [e for e in rec.events if isinstance(e, ev.AttemptFailed)]
    assert len(failed) == FAULTS
    assert all(e.kind == "transient" and e.reason == "stream ended before [DONE]" for e in failed)


async def test_a_stream_cut_after_text_fails_that_request_and_no_other() -> None:
    # 16 tokens, 4 pieces: the cut comes after two pieces reached the caller, so it
    # cannot be retried without sending the caller the same text twice.
    rec = Recorder(keep=True)
    async with running_simulator(scenario(answer_tokens=16)) as sim:
        await set_fault(sim, mode="stream_cut", count=FAULTS, model="sim-flagship")
        async with FallbackClient(sim_config(sim.base_url), environ=ENV) as client:
            client.bus.subscribe(rec)

            async def one(i: int) -> tuple[str, BaseException | None]:
                pieces: list[str] = []
                try:
                    async for piece in client.stream(f"request {i}", continuation=False):  # opted out
                        pieces.append(piece)
                except RequestFailed as e:
                    return "".join(pieces), e
                return "".join(pieces), None

            outcomes = await asyncio.gather(*(one(i) for i in range(N)))
            snap = client.snapshot()
        stats = await sim_stats(sim)
    broken = [(text, e) for text, e in outcomes if e is not None]
    assert len(broken) == FAULTS
    for text, e in broken:
        assert isinstance(e, RequestFailed) and e.failure.kind is Kind.TRANSIENT
        assert "after output was sent" in str(e)
        assert 0 < len(text.split()) < 16  # the caller saw part of the answer, then the error
    assert all(len(text.split()) == 16 for text, e in outcomes if e is None)
    done = done_events(rec)
    assert len(done) == N and sum(not e.ok for e in done) == FAULTS
    assert snap.failed == FAULTS and snap.succeeded == N - FAULTS
    assert stats["totals"]["completed"] == N - FAULTS


async def test_a_stream_cut_after_text_is_recorded_as_a_failed_attempt() -> None:
    rec = Recorder(keep=True)
    seen: list[Any] = []
    async with running_simulator(scenario(answer_tokens=16)) as sim:
        await set_fault(sim, mode="stream_cut", count=1, model="sim-flagship")
        async with FallbackClient(sim_config(sim.base_url), environ=ENV) as client:
            client.bus.subscribe(rec)
            client.add_observer(lambda request, attempt: seen.append(attempt))  # the audit log's hook
            with pytest.raises(RequestFailed) as info:
                async for _ in client.stream("hi", continuation=False):  # opted out
                    pass
            flagship = client.snapshot().targets[0]
    assert info.value.attempts and info.value.attempts[-1].kind is Kind.TRANSIENT
    assert info.value.attempts[-1].decision == "fail"
    assert [a.kind for a in seen] == [Kind.TRANSIENT]
    assert rec.counts["AttemptFailed"] == 1
    assert flagship.window(60).requests == 1 and flagship.window(60).other == 1


async def test_every_fault_at_once_across_all_models() -> None:
    rules = [{"mode": m, "count": 2} for m in ("reset", "truncate", "hang", "invalid_json", "html_500")]
    rec = Recorder(keep=True)
    async with running_simulator(scenario()) as sim:
        await set_faults(sim, rules)
        cfg = sim_config(sim.base_url, extra="[client]\nattempt_timeout = 20.0\n")
        async with FallbackClient(cfg, environ=ENV) as client:
            client.bus.subscribe(rec)
            results = await run_batch(client, 60)
        stats = await sim_stats(sim)
    results = check_all_answered(results, rec, stats["totals"]["completed"])
    failed = failed_attempts(results)
    assert len(failed) == 10 and stats["totals"]["faults"] == 10 and stats["faults"] == []
    # the hung ones are silent routes (no headers within the attempt's timeout): left, not retried
    hung = [a for a in failed if a.kind is Kind.CAPACITY]
    assert len(hung) == 2 and all(a.reason.endswith("the route is silent") and a.decision != "retry" for a in hung)
    assert all(a.kind is Kind.TRANSIENT and a.decision == "retry" for a in failed if a not in hung)
    starts = collections.Counter(a.reason.split(" (")[0].split(":")[0] for a in failed if a not in hung)
    assert starts == {"protocol error": 2, "200 with a broken body": 4, "500 Internal Server Error": 2}


# ---------------------------------------------------------------- nobody listening


async def test_connection_refused_is_classified_as_a_transient_connect_failure() -> None:
    async with running_simulator(scenario()) as sim:
        # small's only endpoint is dead; with a max of one attempt the failure is final
        cfg = sim_config(
            sim.base_url,
            endpoints={"dead": dead_url()},
            models={"small": ["dead"]},
            extra="[client]\nmax_attempts = 1\n",
        )
        async with FallbackClient(cfg, environ=ENV) as client:
            with pytest.raises(RequestFailed) as info:
                await client.chat("hi", model="small")
    (attempt,) = info.value.attempts
    assert attempt.kind is Kind.UNREACHABLE and attempt.status is None and attempt.target == "small@dead/k"
    assert attempt.reason.startswith("endpoint dead (127.0.0.1:"), attempt.reason
    assert "is unreachable: connection refused (ConnectError" in attempt.reason, attempt.reason
    assert info.value.failure.code == "connection_refused"


BUG_DEAD_ENDPOINT = (
    "router: a transient failure retries the same target (nothing avoids it, and connect failures never count "
    "toward its breaker), so a dead endpoint ahead of a live one spends the retry budget and requests fail"
)


async def test_a_dead_first_endpoint_of_a_model_falls_through_to_its_second_endpoint() -> None:
    rec = Recorder(keep=True)
    async with running_simulator(scenario()) as sim:
        cfg = sim_config(sim.base_url, endpoints={"dead": dead_url()}, models={"flagship": ["dead", "sim"]})
        async with FallbackClient(cfg, environ=ENV) as client:
            client.bus.subscribe(rec)
            concurrent = await run_batch(client)
            one_by_one = [await answer_or_error(client, f"later {i}") for i in range(20)]
        stats = await sim_stats(sim)
    results = check_all_answered([*concurrent, *one_by_one], rec, stats["totals"]["completed"])
    # Under concurrent load a full flagship@sim spills to the next model, as routing says;
    # one request at a time, every one goes to the flagship's live endpoint.
    assert all(r.endpoint == "sim" for r in results)
    assert all(r.model == "flagship" for r in results[len(concurrent) :])
    for a in failed_attempts(results):
        assert a.kind is Kind.UNREACHABLE and a.target == "flagship@dead/k"
        assert a.reason.startswith("endpoint dead (127.0.0.1:") and "connection refused" in a.reason


async def test_a_dead_model_among_three_costs_no_request() -> None:
    rec = Recorder(keep=True)
    async with running_simulator(scenario()) as sim:
        cfg = sim_config(sim.base_url, endpoints={"dead": dead_url()}, models={"flagship": ["dead"]})
        async with FallbackClient(cfg, environ=ENV) as client:
            client.bus.subscribe(rec)
            concurrent = await run_batch(client)
            one_by_one = [await answer_or_error(client, f"later {i}") for i in range(20)]
        stats = await sim_stats(sim)
    results = check_all_answered([*concurrent, *one_by_one], rec, stats["totals"]["completed"])
    assert all(r.model in ("medium", "small") for r in results)
    assert all(r.model == "medium" for r in results[len(concurrent) :])


# ---------------------------------------------------------------- a restart


async def _restart_run(n: int, down: float, extra: str = "") -> tuple[list[Any], Recorder, int, int]:
    """``n`` requests, arriving over a few seconds; the simulator is stopped one second in
    and started again on the same port ``down`` seconds later."""
    rec = Recorder(keep=True)
    scn = scenario(base_latency=0.2)
    first = await start_simulator(scn)
    port = first.port
    completed = 0
    try:
        async with FallbackClient(sim_config(first.base_url, extra=extra), environ=ENV) as client:
            client.bus.subscribe(rec)

            async def one(i: int) -> ChatResult:
                await asyncio.sleep(i * 0.02)
                return await client.chat(f"request {i}")

            tasks = [asyncio.create_task(one(i)) for i in range(n)]
            await asyncio.sleep(1.0)
            in_flight_at_stop = client.snapshot().in_flight
            await first.stop()  # open requests get the graceful shutdown; new connections are refused
            completed += first.simulator.stats()["totals"]["completed"]  # it is down: read its counters directly
            await asyncio.sleep(down)
            second = await start_simulator(scn, port=port)
            try:
                results = await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                completed += second.simulator.stats()["totals"]["completed"]
                # The client's own probes of the endpoint while it was down, those that got an answer.
                completed -= sum(1 for e in rec.events if isinstance(e, ev.ProbeFinished) and e.ok)
                await second.stop()
    finally:
        await first.stop()
    return results, rec, completed, in_flight_at_stop


async def test_a_restart_without_downtime_loses_nothing() -> None:
    results, rec, completed, in_flight = await _restart_run(200, 0.0, "[client]\nretry_budget = 10.0\n")
    assert in_flight > 0  # the stop really came in the middle of the run
    results = check_all_answered(results, rec, completed)

    for a in failed_attempts(results):
        # Retried, or (for a connection that was refused) sent to another model at once.
        assert a.kind in (Kind.TRANSIENT, Kind.UNREACHABLE) and a.decision in ("retry", "fallback")


async def test_a_restart_in_the_middle_of_a_run_loses_nothing() -> None:
    results, rec, completed, in_flight = await _restart_run(200, 5.0)
    assert in_flight > 0
    results = check_all_answered(results, rec, completed)
    for a in failed_attempts(results):
        # cut while answering, or refused while it was down (it had answered: requests wait for it)
        assert a.kind in (Kind.TRANSIENT, Kind.UNREACHABLE)
