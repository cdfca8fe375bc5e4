"""The first-token limit and the stall bound from the library (issue 29 items 1-3), against the
simulator over real HTTP, on looptime (loop seconds)."""

from __future__ import annotations

import asyncio

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types.failure import FIRST_TOKEN, STALLED, Kind
from capmon.core.types.result import Decision, Skip, sent
from capmon.sim.server import running_simulator
from tests.reliability.helpers import ENV, scenario, set_fault, sim_config

pytestmark = [pytest.mark.integration, pytest.mark.looptime]


async def test_a_request_s_own_limit_bounds_a_plain_answer_and_falls_over() -> None:
    loop = asyncio.get_running_loop()
    async with running_simulator(scenario()) as sim:
        await set_fault(sim, mode="slow_first_token", seconds=20, rate=1.0, model="sim-flagship")
        async with FallbackClient(sim_config(sim.base_url), environ=ENV) as client:
            t0 = loop.time()
            result = await client.chat("hi", first_token_timeout=3)
            took = loop.time() - t0
            plain = await client.chat("hi")  # the config's limit is for streams: a plain answer waits
    assert took < 4.0 and result.model != "flagship"
    first = sent(result.attempts)[0]
    assert (first.model, first.kind, first.decision) == ("flagship", Kind.CAPACITY, Decision.FALLBACK)
    assert first.reason == "no first token within 3s (first_token_timeout)"
    assert plain.model == "flagship"


async def test_a_silent_stream_is_passed_over_with_its_skip_on_the_record() -> None:
    cfg = "[client]\nfirst_token_timeout = 5.0\n"
    async with running_simulator(scenario()) as sim:
        await set_fault(sim, mode="hang", rate=1.0, model="sim-flagship")
        async with FallbackClient(sim_config(sim.base_url, extra=cfg), environ=ENV) as client:
            first = client.stream_chunks("hi")
            [c async for c in first]
            second = client.stream_chunks("hi")
            [c async for c in second]
    assert [(a.model, a.decision) for a in first.attempts][:1] == [("flagship", Decision.FALLBACK)]
    assert [(a.model, a.skip) for a in second.skipped] == [("flagship", Skip.SILENT)]


async def test_a_stall_after_output_is_a_break_with_its_own_reason() -> None:
    loop = asyncio.get_running_loop()
    cfg = "[client]\nstall_timeout = 5.0\n"
    async with running_simulator(scenario(answer_tokens=40)) as sim:
        await set_fault(sim, mode="stall", tokens=20, seconds=30, count=1, model="sim-flagship")
        async with FallbackClient(sim_config(sim.base_url, extra=cfg), environ=ENV) as client:
            texts: list[str] = []
            t0 = loop.time()
            with pytest.raises(RequestFailed) as info:
                async for text in client.stream("hi", continuation=False):
                    texts.append(text)
            took = loop.time() - t0
    assert took < 6.0 and len("".join(texts).split()) == 20
    f = info.value.failure
    assert (f.kind, f.code) == (Kind.TRANSIENT, STALLED) and FIRST_TOKEN != STALLED
    assert str(info.value) == (
        "stream broke after output was sent: transient: "
        "stream stalled: no bytes for 5s after output began (stall_timeout)"
    )
