"""The simulator's paced faults over real HTTP, on looptime (loop seconds): ``slow_first_token``
sends the headers at once and the first token ``seconds`` later, plain or streamed; ``stall``
streams ``tokens`` tokens, then nothing for ``seconds``, then the rest of the answer."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from capmon.sim.scenario import Scenario
from capmon.sim.server import SimHandle
from tests.sim.helpers import AUTH, chat_body, content_of, data_frames, fast_scenario

pytestmark = pytest.mark.looptime


@pytest.fixture
def sim_scenario() -> Scenario:
    return fast_scenario(answer_tokens=40)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_slow_first_token_sends_its_headers_at_once(
    sim: SimHandle, http: httpx.AsyncClient, stream: bool
) -> None:
    loop = asyncio.get_running_loop()
    r = await http.post(f"{sim.admin_url}/faults", json={"mode": "slow_first_token", "seconds": 20})
    assert r.json()["faults"] == [{"mode": "slow_first_token", "count": 1, "rate": None, "model": None, "seconds": 20}]
    t0 = loop.time()
    async with http.stream(
        "POST", f"{sim.base_url}/chat/completions", json=chat_body(stream=stream), headers=AUTH
    ) as r:
        headers_at = loop.time() - t0
        body = (await r.aread()).decode()
    assert r.status_code == 200 and headers_at < 1.0
    assert loop.time() - t0 >= 20.0
    if stream:
        assert len(content_of(data_frames(body)).split()) == 40 and "[DONE]" in body
    else:
        assert r.json()["choices"][0]["message"]["content"]


async def test_a_stall_after_n_tokens_then_the_rest(sim: SimHandle, http: httpx.AsyncClient) -> None:
    loop = asyncio.get_running_loop()
    await http.post(f"{sim.admin_url}/faults", json={"mode": "stall", "tokens": 20, "seconds": 20})
    seen: list[tuple[float, str]] = []
    t0 = loop.time()
    async with http.stream("POST", f"{sim.base_url}/chat/completions", json=chat_body(stream=True), headers=AUTH) as r:
        async for piece in r.aiter_text():
            seen.append((loop.time() - t0, piece))
    before = "".join(p for at, p in seen if at < 20.0)
    assert len(content_of(data_frames(before)).split()) == 20  # 20 tokens, then 20 s of nothing
    whole = "".join(p for _, p in seen)
    assert len(content_of(data_frames(whole)).split()) == 40 and "[DONE]" in whole
    assert seen[-1][0] >= 20.0


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"mode": "stall", "tokens": 20}, 'a stall fault needs "seconds": N'),
        ({"mode": "slow_first_token"}, 'a slow_first_token fault needs "seconds": N'),
        ({"mode": "stall", "tokens": -1, "seconds": 1}, "tokens must be"),
        ({"mode": "stall", "seconds": "5"}, "seconds must be a number"),
        ({"mode": "reset", "seconds": 1}, "applies only to mode 'slow_first_token' or 'stall'"),
        ({"mode": "slow_first_token", "seconds": 1, "tokens": 3}, "applies only to mode 'stall'"),
    ],
)
async def test_bad_paced_rules(sim: SimHandle, http: httpx.AsyncClient, bad: dict[str, object], message: str) -> None:
    r = await http.post(f"{sim.admin_url}/faults", json=bad)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.json()
