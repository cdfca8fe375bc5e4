"""``x-capmon-deadline`` through the gateway, with the real openai SDK, against a
simulated provider that accepts requests and never answers (its ``hang`` fault) or
stalls in the middle of a stream: the error comes when the deadline passes, not after
every attempt has run its whole ``attempt_timeout``. The figures are loop seconds
(looptime fast-forwards the gateway, the simulator and the SDK alike)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.gateway.helpers import HELLO, running, scenario, spec

pytestmark = pytest.mark.looptime

SLACK = 0.5  # the figure: the error within deadline + 0.5 s
MANY_LONG_ATTEMPTS = "[client]\nattempt_timeout = 5.0\nmax_attempts = 50"
DEADLINE = {"x-capmon-deadline": "2"}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_hanging_upstream_gets_its_error_when_the_header_deadline_passes(stream: bool) -> None:
    # On the original code: a 502 after every model's attempts of 5 s each (55 s in the issue).
    loop = asyncio.get_running_loop()
    async with running(extra=MANY_LONG_ATTEMPTS) as gw, gw.openai() as sdk:
        await gw.sim_admin("faults", {"mode": "hang", "rate": 1.0})
        t0 = loop.time()
        with pytest.raises(openai.APIStatusError) as info:
            if stream:
                async for _ in await sdk.chat.completions.create(
                    model="auto", messages=HELLO, stream=True, extra_headers=DEADLINE
                ):
                    pass
            else:
                await sdk.chat.completions.create(model="auto", messages=HELLO, extra_headers=DEADLINE)
        took = loop.time() - t0
        in_flight = gw.client.snapshot().in_flight
    r = info.value.response
    assert took <= 2.0 + SLACK, (took, r.status_code, r.text)
    assert r.status_code == 504 and r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["type"] == "upstream_error" and err["code"] == "deadline_exceeded"
    assert "the request's own deadline of 2s passed" in err["message"], err
    assert "given up 2.0s after the request started" in err["message"], err
    assert r.headers["x-capmon-attempts"] == "1"  # one attempt, cut to the 2 s left
    assert in_flight == 0  # the cut attempt freed its slot


async def test_a_stream_that_stalls_after_output_ends_with_an_error_at_the_deadline() -> None:
    # A chunk of four tokens every 1.6 s: the first arrives at 1.8 s, the next after the
    # 2 s deadline. On the original code the stream went on to the attempt's own 5 s.
    slow = scenario(spec("flagship", per_token=0.4), spec("medium"), spec("small"))
    loop = asyncio.get_running_loop()
    async with running(slow, extra=MANY_LONG_ATTEMPTS) as gw, gw.openai() as sdk:
        t0 = loop.time()
        texts: list[str] = []
        with pytest.raises(openai.APIError) as info:
            async for chunk in await sdk.chat.completions.create(
                model="flagship", messages=HELLO, stream=True, extra_headers=DEADLINE
            ):
                texts.extend(c.delta.content or "" for c in chunk.choices)
        took = loop.time() - t0
        in_flight = gw.client.snapshot().in_flight
    assert took <= 2.0 + SLACK, (took, str(info.value))
    assert "".join(texts)  # output was shown, and then the stream ended with an error, not as complete
    message = str(info.value)
    assert "the answer is incomplete" in message and "the request's own deadline of 2s passed" in message, message
    assert in_flight == 0
