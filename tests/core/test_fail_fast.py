"""A request waits only while some model it may use can admit it before its deadline.
When none can (tripped by hand, keys disabled or out of quota past the deadline; no window
large enough: tests/core/test_router_behaviour.py) it fails at once with CannotWait saying
why; a model whose breaker opened by itself, which admits again once its probe answers, is
waited for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import pytest

from capmon.core.base.exceptions import CannotWait, DeadlineExceeded, RequestFailed, Unavailable
from capmon.core.routing.client import FallbackClient
from capmon.core.types.failure import Kind
from capmon.core.types.result import Decision, Request, Skip
from tests.support.breakers import open_every_breaker
from tests.support.configs import ENV, three_models
from tests.support.scripted import OVERLOADED, Reply, Script, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]
E = TypeVar("E", bound=BaseException)

MODELS = ("flagship", "medium", "small")


async def failure_of(call: Awaitable[object], kind: type[E]) -> tuple[E, float]:
    """The error ``call`` raises, and how long (loop time) it took to come."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(kind) as info:
        await call
    return info.value, loop.time() - t0


@contextlib.asynccontextmanager
async def every_model_answering(reply: Reply | None = None) -> AsyncIterator[tuple[Script, FallbackClient]]:
    """A client of three models on a scripted server, each answering ``reply`` (None: ok)."""
    script = Script()
    for m in MODELS if reply is not None else ():
        script.always(m, reply)
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        yield script, client


QUOTA = Reply(
    429,
    {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }
    },
)


async def test_every_model_tripped_by_hand_fails_at_once_with_the_reason() -> None:
    async with every_model_answering() as (script, client):
        for m in MODELS:
            client.trip(m)
        e, took = await failure_of(client.chat("hi"), CannotWait)
    assert took < 1.0 and script.served() == 0
    assert e.why is Unavailable.MODELS and e.retry_after is None
    # Nothing sent; each model on the record as passed over, and why.
    assert [(a.model, a.decision, a.skip) for a in e.attempts] == [(m, Decision.SKIP, Skip.TRIPPED) for m in MODELS]
    assert "flagship is tripped by hand" in str(e) and "small is tripped by hand" in str(e)


async def test_keys_out_of_quota_past_the_deadline_fail_at_once_with_the_reset_time() -> None:
    async with every_model_answering(QUOTA) as (script, client):
        with pytest.raises(RequestFailed) as first:  # it meets the quotas one by one
            await client.chat("hi")
        e, took = await failure_of(client.chat(Request.of("hi", deadline=60)), CannotWait)
    assert first.value.failure.kind is Kind.QUOTA and not isinstance(first.value, CannotWait)
    assert took < 1.0 and script.served() == 3  # the second request sent nothing
    assert e.why is Unavailable.KEYS and e.failure.kind is Kind.QUOTA
    assert e.retry_after is not None and e.retry_after > 60  # the reset is known, and past the deadline


async def test_every_key_disabled_fails_at_once() -> None:
    refused = Reply(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
    async with every_model_answering(refused) as (script, client):
        with pytest.raises(RequestFailed):
            await client.chat("hi")
        e, took = await failure_of(client.chat("hi"), CannotWait)
    assert e.why is Unavailable.KEYS and e.failure.kind is Kind.AUTH and script.served() == 1
    assert e.retry_after is None and took < 1.0


async def test_a_breaker_open_by_itself_is_waited_for_until_the_deadline() -> None:
    async with every_model_answering(OVERLOADED) as (script, client):
        await open_every_breaker(client)
        e, took = await failure_of(client.chat(Request.of("hi", deadline=20)), DeadlineExceeded)
    assert not isinstance(e, CannotWait)
    assert took >= 19.9  # it waited for a probe to find a model back, as long as it was allowed


async def test_a_waiting_request_ends_when_the_last_model_it_waits_for_is_tripped_by_hand() -> None:
    async with every_model_answering(OVERLOADED) as (script, client):
        await open_every_breaker(client)
        waiting = asyncio.ensure_future(client.chat(Request.of("hi", deadline=300)))
        await asyncio.sleep(10)
        assert not waiting.done()
        for m in MODELS:
            client.trip(m)
        e, took = await failure_of(waiting, CannotWait)
    assert took < 1.0 and e.why is Unavailable.MODELS
