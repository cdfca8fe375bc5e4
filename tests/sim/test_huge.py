"""The huge fault over real HTTP: bodies of N bytes, valid or not, plain or streamed, made
by a generator, so that the server's memory stays flat while it sends them."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import httpx
import pytest

from capmon.sim.scenario import Scenario
from capmon.sim.server import SimHandle
from tests.sim.helpers import AUTH, chat_body, content_of, data_frames, fast_scenario

MB = 1024 * 1024


@pytest.fixture
def sim_scenario() -> Scenario:
    return fast_scenario(slots=1)


async def huge(sim: SimHandle, http: httpx.AsyncClient, size: int, valid: bool, **extra: Any) -> httpx.Response:
    r = await http.post(f"{sim.admin_url}/faults", json={"mode": "huge", "bytes": size, "valid": valid})
    assert r.json()["faults"][0] == {
        "mode": "huge",
        "count": 1,
        "rate": None,
        "model": None,
        "bytes": size,
        "valid": valid,
    }
    return await http.post(f"{sim.base_url}/chat/completions", json=chat_body(**extra), headers=AUTH)


async def test_valid_huge_completion(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await huge(sim, http, 3 * MB + 7, True)
    assert r.status_code == 200 and int(r.headers["content-length"]) == len(r.content)
    body = r.json()
    assert body["object"] == "chat.completion"
    assert len(body["choices"][0]["message"]["content"]) == 3 * MB + 7
    stats = (await http.get(f"{sim.admin_url}/stats")).json()
    assert stats["totals"]["faults"] == 1 and stats["models"]["sim-a"]["in_flight"] == 0  # it held no slot


async def test_invalid_huge_body_is_exactly_n_bytes_of_not_json(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await huge(sim, http, 2 * MB + 3, False)
    assert r.status_code == 200 and len(r.content) == 2 * MB + 3 == int(r.headers["content-length"])
    with pytest.raises(ValueError):
        json.loads(r.content)


async def test_valid_huge_stream(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await huge(sim, http, MB + 5, True, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = data_frames(r.text)
    assert len(content_of(chunks)) == MB + 5
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and r.text.endswith("data: [DONE]\n\n")


async def test_invalid_huge_stream_is_one_endless_line(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await huge(sim, http, MB, False, stream=True)
    assert len(r.content) == MB and r.content.startswith(b"data: ") and b"\n" not in r.content


async def test_huge_passes_the_responses_api_by(sim: SimHandle, http: httpx.AsyncClient) -> None:
    await http.post(f"{sim.admin_url}/faults", json={"mode": "huge", "bytes": 10})
    r = await http.post(f"{sim.base_url}/responses", json={"model": "sim-a", "input": "hi"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["object"] == "response"
    assert (await http.get(f"{sim.admin_url}/faults")).json()["faults"] != []  # still waiting for a chat request


@pytest.mark.parametrize("stream", [False, True])
async def test_sending_a_huge_body_keeps_memory_flat(sim: SimHandle, http: httpx.AsyncClient, stream: bool) -> None:
    size = 48 * MB
    await http.post(f"{sim.admin_url}/faults", json={"mode": "huge", "bytes": size, "valid": True})
    tracemalloc.start()
    try:
        received = 0
        async with http.stream(
            "POST", f"{sim.base_url}/chat/completions", json=chat_body(stream=stream), headers=AUTH
        ) as r:
            async for piece in r.aiter_raw():
                received += len(piece)  # read and dropped: the client holds nothing either
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert received >= size
    # Server and client share this process: everything they held at once, together.
    assert peak < 8 * MB, f"peak {peak / MB:.1f} MiB while sending {size / MB:.0f} MiB"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"mode": "huge"}, 'needs "bytes"'),
        ({"mode": "huge", "bytes": 0}, "bytes must be"),
        ({"mode": "huge", "bytes": 10, "valid": "yes"}, "valid must be true or false"),
        ({"mode": "reset", "bytes": 10}, "applies only to mode 'huge'"),
    ],
)
async def test_bad_huge_rules(sim: SimHandle, http: httpx.AsyncClient, bad: dict[str, object], message: str) -> None:
    r = await http.post(f"{sim.admin_url}/faults", json=bad)
    assert r.status_code == 400 and message in r.json()["error"]["message"]
