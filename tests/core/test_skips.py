"""Every target a request passes over is on its record, with why: never sent, a ``skip``
record (``Attempt.skip``, the detail in ``reason``) before the attempt that went past it,
and a ``TargetSkipped`` event. A model passed over is no stop on the way: it counts neither
as an attempt nor as a fallback of its own.

An endpoint that cannot be connected to is UNREACHABLE, and a request waits for it only if
it has answered since the process started (tests/gateway/test_unreachable.py: the gateway)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from capmon.core.base.exceptions import CannotWait, DeadlineExceeded, Unavailable
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.failure import Cause, Kind
from capmon.core.types.result import Decision, Request, Skip, sent
from tests.support.configs import ENV, build_config, three_models
from tests.support.scripted import OVERLOADED, Reply, Script, free_port, ok, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]


def _skips(attempts: object) -> list[tuple[str, Skip | None]]:
    return [(a.model, a.skip) for a in attempts if a.decision is Decision.SKIP]  # type: ignore[attr-defined]


async def test_a_model_tripped_by_hand_is_passed_over_on_the_record_and_in_an_event() -> None:
    script = Script()
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        seen: list[ev.Event] = []
        client.bus.subscribe(seen.append)
        client.trip("flagship")
        result = await client.chat(Request.of("hi", request_id="caller-1"))
    assert result.model == "medium" and _skips(result.attempts) == [("flagship", Skip.TRIPPED)]
    assert result.skipped[0].reason.startswith("tripped: tripped by hand")
    assert len(sent(result.attempts)) == 1 and result.fallbacks == 1  # flagship -> medium, nothing more
    (event,) = [e for e in seen if isinstance(e, ev.TargetSkipped)]
    assert (event.model, event.skip, event.caller_request_id) == ("flagship", Skip.TRIPPED, "caller-1")
    (moved,) = [e for e in seen if isinstance(e, ev.FellBack)]
    assert moved.reason.startswith("flagship skipped: tripped")


async def test_an_open_breaker_and_a_full_model_are_each_passed_over_with_why() -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    async with serve(script) as url:
        cfg = three_models(url, extra="[limiter]\ninitial = 1\nmin = 1\nmax = 1\n")
        async with FallbackClient(cfg, environ=ENV) as client:
            for _ in range(3):  # three capacity failures trip the flagship's breaker
                await client.chat("hi")
            script.always("medium", Reply(200, ok("medium").body, delay=1.0))
            # one slow request holds medium's only slot; the next passes both over
            held = asyncio.ensure_future(client.chat("hold medium", model="medium"))
            await asyncio.sleep(0.01)
            result = await client.chat("hi")
            await held
    assert result.model == "small"
    assert _skips(result.attempts) == [("flagship", Skip.OPEN), ("medium", Skip.FULL)]
    assert "breaker open" in result.skipped[0].reason and "every slot" in result.skipped[1].reason


async def test_a_request_that_fails_at_once_says_why_of_every_model() -> None:
    script = Script()
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        for m in ("flagship", "medium", "small"):
            client.trip(m)
        with pytest.raises(CannotWait) as info:
            await client.chat("hi")
    assert _skips(info.value.attempts) == [(m, Skip.TRIPPED) for m in ("flagship", "medium", "small")]


async def test_an_endpoint_never_reached_fails_at_once_naming_it_and_its_cause() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    cfg = build_config(dead, models=["flagship"])
    async with FallbackClient(cfg, environ=ENV) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(CannotWait) as info:
            await client.chat("hi")
        assert loop.time() - t0 < 1.0  # no wait for a probe that nothing says will ever answer
        # the next request is refused without another attempt once the breaker is open
        for _ in range(3):
            with pytest.raises(CannotWait):
                await client.chat("hi")
        with pytest.raises(CannotWait) as later:
            await client.chat("hi")
        snap = client.snapshot()
    e = info.value
    assert e.why is Unavailable.UNREACHABLE and e.failure.kind is Kind.UNREACHABLE
    assert e.failure.code == Cause.REFUSED and e.retry_after is None
    assert str(e).startswith("no model can serve this request: endpoint ep (127.0.0.1:")
    assert "connection refused" in str(e) and "capacity" not in str(e)
    assert len(sent(e.attempts)) == 1
    assert sent(later.value.attempts) == [] and _skips(later.value.attempts) == [("flagship", Skip.UNREACHABLE)]
    (t,) = snap.targets
    assert t.unreachable_reason is not None and t.never_reached and t.last_kind is Kind.UNREACHABLE


async def test_an_endpoint_that_answered_before_is_waited_for_and_the_deadline_says_why() -> None:
    async with contextlib.AsyncExitStack() as stack:
        server = contextlib.AsyncExitStack()
        url = await server.enter_async_context(serve(Script()))
        client = await stack.enter_async_context(FallbackClient(build_config(url, models=["flagship"]), environ=ENV))
        await client.chat("hi")  # it answered: a later failure to connect is an outage, waited for
        await server.aclose()  # gone: the same port refuses now
        with pytest.raises(DeadlineExceeded) as info:
            await client.chat(Request.of("hi", deadline=10.0))
    e = info.value
    assert e.failure.kind is Kind.UNREACHABLE and "connection refused" in str(e)
    assert len(sent(e.attempts)) >= 2  # it waited and tried again
