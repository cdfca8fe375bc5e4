"""A short server hint on the preferred model (issue 29, item 6): a 429 with a Retry-After
within the request's [client.patience] (by its priority) is waited out on that model; a
longer one moves the request to a model that admits it sooner (ARCHITECTURE.md, "A hint
against another model"). A scripted upstream over real HTTP, in fast-forwarded time."""

from __future__ import annotations

import asyncio

import pytest

from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import Config, PatienceConfig
from capmon.core.types.result import Decision, Priority
from tests.support.configs import ENV, three_models
from tests.support.scripted import Reply, Script, ok, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]


def _limited(hint: float) -> Reply:
    return Reply(
        429,
        {"error": {"message": "Rate limit reached.", "type": "requests", "code": "rate_limit_exceeded"}},
        {"retry-after": f"{hint:g}"},
    )


async def _once(hint: float, extra: str = "", priority: Priority = Priority.INTERACTIVE) -> tuple[str, list, float]:
    """The flagship answers its first request 429 with ``hint``, then normally: which model
    served, the attempts (model, decision), and how long the request took."""
    script = Script()
    script.set("flagship", lambda n, body: _limited(hint) if n == 1 else ok("flagship"))
    async with serve(script) as url, FallbackClient(three_models(url, extra=extra), environ=ENV) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        result = await client.chat("hi", priority=priority)
        took = loop.time() - t0
    return result.model, [(a.model, a.decision) for a in result.attempts], took


def test_the_defaults_differ_by_priority() -> None:
    p = Config().client.patience
    assert p == PatienceConfig() and (p.interactive, p.batch) == (2.0, 30.0)
    assert p.of(Priority.INTERACTIVE.value) == 2.0 and p.of(Priority.BATCH.value) == 30.0


async def test_a_hint_within_patience_is_waited_out_on_the_preferred_model() -> None:
    model, attempts, took = await _once(2.0)  # the interactive default: 2 s
    assert model == "flagship", attempts
    assert attempts == [("flagship", Decision.RETRY), ("flagship", Decision.OK)]
    assert 2.0 <= took <= 3.0 + 0.5, took  # the hint, spread by [backoff] hint_spread (up to 1.5x)


async def test_with_no_patience_the_hint_moves_the_request_down_at_once() -> None:
    model, attempts, took = await _once(2.0, "[client.patience]\ninteractive = 0\n")
    assert model == "medium" and [m for m, _ in attempts] == ["flagship", "medium"], attempts
    assert took < 1.0, took


async def test_a_hint_longer_than_patience_still_moves_it() -> None:
    model, attempts, took = await _once(5.0)
    assert model == "medium" and [m for m, _ in attempts] == ["flagship", "medium"], attempts
    assert took < 1.0, took


async def test_a_batch_request_waits_out_a_hint_an_interactive_one_does_not() -> None:
    interactive = await _once(10.0)
    batch = await _once(10.0, priority=Priority.BATCH)  # the batch default: 30 s
    assert interactive[0] == "medium" and interactive[2] < 1.0, interactive
    assert batch[0] == "flagship" and 10.0 <= batch[2] <= 15.0 + 0.5, batch


async def test_patience_never_waits_past_the_deadline() -> None:
    model, attempts, took = await _once(10.0, "[client]\ndeadline = 5\n", priority=Priority.BATCH)
    assert model == "medium" and took < 1.0, (attempts, took)


async def test_a_refused_ask_above_the_learned_capacity_does_not_wait_out_the_hint() -> None:
    # The limiter's ask for more room rides on a user's request (capmon/core/control/limiter.py):
    # refused with a hint the request would wait out, it takes the next slot anywhere instead.
    from capmon.core.types.failure import Failure, Kind

    async with FallbackClient(three_models("http://127.0.0.1:9/v1"), environ=ENV) as client:
        r = client._new("hi", {})
        flagship = client.targets[0]
        now = client.clock.now()
        full = Failure(Kind.RATE_LIMITED, "Rate limit reached.", 429, retry_after=2.0)
        kept = client._plan(r, flagship, full, 1, now, spend_retry=lambda: True)
        asked = client._plan(r, flagship, full, 1, now, spend_retry=lambda: True, asked=True)
    assert kept.stick_to == "flagship"  # within its patience: waits it out on the flagship
    assert asked.stick_to is None and asked.skip is not None  # backs off the flagship, goes anywhere else
