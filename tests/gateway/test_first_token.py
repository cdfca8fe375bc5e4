"""Issue 29, items 1-3, through the gateway with the real openai and anthropic SDKs against the
simulator's faults: a silent route (``hang``: no headers ever) is left at the first-token limit,
tried once and passed over until its probe answers; a slow first token (``slow_first_token``)
falls over at the limit; a stall after output (``stall``) ends the stream with a clear in-band
error within ``stall_timeout``. The figures are loop seconds (looptime fast-forwards the
gateway, the simulator and the SDKs alike)."""

from __future__ import annotations

import asyncio
import inspect
import itertools
from typing import Any

import anthropic
import openai
import pytest

from capmon.core.types.result import Attempt, Decision, Request, Skip
from tests.gateway.helpers import HELLO, running, scenario, spec
from tests.gateway.test_continuation import unbroken

pytestmark = pytest.mark.looptime

LIMITS = "[client]\nfirst_token_timeout = 5.0\nstall_timeout = 5.0"
FLAGSHIP = "sim-flagship"
HI = [{"role": "user", "content": "Hello"}]


def _records(gw: Any) -> list[tuple[Request, Attempt]]:
    seen: list[tuple[Request, Attempt]] = []
    gw.client.add_observer(lambda r, a: seen.append((r, a)))
    return seen


NOT_CONTINUED = {"x-capmon-continue": "false"}  # the break itself, as before continuation


async def _parsed(raw: Any) -> Any:
    out = raw.parse()
    return await out if inspect.isawaitable(out) else out


async def _stream_text(sdk: openai.AsyncOpenAI, **kw: Any) -> tuple[str, dict[str, str]]:
    raw = await sdk.chat.completions.with_raw_response.create(model="flagship", messages=HELLO, stream=True, **kw)
    texts = [c.delta.content or "" async for chunk in await _parsed(raw) for c in chunk.choices]
    return "".join(texts), dict(raw.headers)


async def test_a_silent_route_is_left_at_the_limit_tried_once_and_passed_over_until_its_probe_answers() -> None:
    loop = asyncio.get_running_loop()
    async with running(extra=LIMITS) as gw, gw.openai() as sdk:
        seen = _records(gw)
        await gw.sim_admin("faults", {"mode": "hang", "rate": 1.0, "model": FLAGSHIP})
        t0 = loop.time()
        text, first = await _stream_text(sdk)
        took = loop.time() - t0
        assert text and took <= 5.0 + 1.0, took
        assert (first["x-capmon-model"], first["x-capmon-attempts"], first["x-capmon-fallbacks"]) == (
            "medium",
            "2",
            "1",
        )
        tried = [a for _, a in seen if a.model == "flagship"]
        assert len(tried) == 1 and tried[0].decision is Decision.FALLBACK  # once, never a retry on the route
        assert tried[0].kind is not None and tried[0].kind.value == "capacity"
        assert "no response headers within 5s: the route is silent" in tried[0].reason
        assert gw.client.snapshot().targets[0].state.value == "open"  # its breaker opened at once

        # The next request passes it over at once, with the skip on its record.
        seen.clear()
        t0 = loop.time()
        text, second = await _stream_text(sdk)
        assert text and loop.time() - t0 < 1.0
        assert second["x-capmon-model"] == "medium" and second["x-capmon-attempts"] == "1"
        assert "=silent (" in second["x-capmon-skipped"], second["x-capmon-skipped"]
        skips = [a for _, a in seen if a.decision is Decision.SKIP]
        assert [(a.model, a.skip) for a in skips] == [("flagship", Skip.SILENT)]
        assert "passed over until its probe answers" in skips[0].reason

        # The fault ends; its probe (2 s after the trip) answers, and it serves again.
        await gw.sim_admin("faults", {"mode": "off"})
        await asyncio.sleep(3.0)
        _, back = await _stream_text(sdk)
        assert back["x-capmon-model"] == "flagship", back


async def test_a_first_token_after_20s_with_a_5s_limit_is_served_by_the_fallback_in_under_6s() -> None:
    loop = asyncio.get_running_loop()
    async with running(extra=LIMITS) as gw, gw.openai() as sdk:
        seen = _records(gw)
        await gw.sim_admin("faults", {"mode": "slow_first_token", "seconds": 20, "rate": 1.0, "model": FLAGSHIP})
        t0 = loop.time()
        text, headers = await _stream_text(sdk)
        took = loop.time() - t0
        snap = gw.client.snapshot()
    assert text and took < 6.0, took
    assert headers["x-capmon-model"] == "medium"
    flagship = [a for _, a in seen if a.model == "flagship"]
    assert len(flagship) == 1 and flagship[0].status == 200  # the headers came; the first token did not
    assert flagship[0].reason == "no first token within 5s (first_token_timeout)"
    # counted like a capacity failure: one toward its breaker, which stays closed
    assert snap.targets[0].consecutive_failures == 1 and snap.targets[0].state.value == "closed"


async def test_the_limit_per_request_header_and_a_plain_request_s_whole_answer() -> None:
    # The config's limit is off here; the header sets one, for a plain request too (its first
    # token comes with its whole answer). 0 in the header switches it off.
    loop = asyncio.get_running_loop()
    off = "[client]\nfirst_token_timeout = 0"
    async with running(extra=off) as gw, gw.openai() as sdk:
        await gw.sim_admin("faults", {"mode": "slow_first_token", "seconds": 20, "rate": 1.0, "model": FLAGSHIP})
        for stream in (False, True):
            t0 = loop.time()
            raw = await sdk.chat.completions.with_raw_response.create(
                model="flagship",
                messages=HELLO,
                stream=stream,
                extra_headers={"x-capmon-first-token-timeout": "3"},
            )
            parsed = await _parsed(raw)
            if stream:
                [c async for c in parsed]
            assert loop.time() - t0 < 4.0 and raw.headers["x-capmon-model"] == "medium", stream
        t0 = loop.time()
        answer = await sdk.chat.completions.create(
            model="flagship", messages=HELLO, extra_headers={"x-capmon-first-token-timeout": "0"}
        )
        assert answer.choices[0].message.content and loop.time() - t0 >= 20.0  # waited for it
        for garbage in ("soon", "-1", "1e3", "nan"):
            with pytest.raises(openai.BadRequestError) as info:
                await sdk.chat.completions.create(
                    model="flagship", messages=HELLO, extra_headers={"x-capmon-first-token-timeout": garbage}
                )
            err = info.value.response.json()["error"]
            assert err["param"] == "x-capmon-first-token-timeout", err
            assert err["message"].startswith("x-capmon-first-token-timeout: expected seconds"), err


async def test_a_stall_after_20_tokens_is_continued_within_6s() -> None:
    # Issue 29's acceptance: a stall of 30 s after 20 tokens with stall_timeout 5 is a break
    # like a cut, and the answer is continued (here by the same model: it admits again at once).
    long = scenario(spec("flagship", answer_tokens=60, per_token=0.01), spec("medium"), spec("small"))
    loop = asyncio.get_running_loop()
    async with running(long, extra=LIMITS) as gw, gw.openai() as sdk:
        await gw.sim_admin("faults", {"mode": "stall", "tokens": 20, "seconds": 30, "count": 1, "model": FLAGSHIP})
        t0 = loop.time()
        stream = await sdk.chat.completions.create(model="flagship", messages=HELLO, stream=True)
        chunks, at = [], []
        async for c in stream:
            chunks.append(c)
            at.append(loop.time() - t0)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    words = [len((c.choices[0].delta.content or "").split()) if c.choices else 0 for c in chunks]
    said = list(itertools.accumulate(words))
    stalled = next(t for t, n in zip(at, said, strict=True) if n >= 20)  # the 20th token: the stall begins
    went_on = next(t for t, n in zip(at, said, strict=True) if n > 20)
    assert went_on - stalled < 6.0, (stalled, went_on)  # left at 5 s, and the answer goes on at once
    assert text == unbroken(text) and len(text.split()) == 60  # nothing repeated, nothing missing
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    said = finish[0].model_extra["capmon_continued"]
    assert [c["offset"] for c in said] == [len(" ".join(text.split()[:20]))], said


async def test_a_stall_after_20_tokens_not_continued_ends_with_a_clear_break_within_6s() -> None:
    long = scenario(spec("flagship", answer_tokens=60, per_token=0.01), spec("medium"), spec("small"))
    loop = asyncio.get_running_loop()
    async with running(long, extra=LIMITS) as gw, gw.openai() as sdk:
        seen = _records(gw)
        await gw.sim_admin("faults", {"mode": "stall", "tokens": 20, "seconds": 30, "count": 1, "model": FLAGSHIP})
        texts: list[str] = []
        t0 = loop.time()
        with pytest.raises(openai.APIError) as info:
            async for chunk in await sdk.chat.completions.create(
                model="flagship", messages=HELLO, stream=True, extra_headers=NOT_CONTINUED
            ):
                texts.extend(c.delta.content or "" for c in chunk.choices)
        took = loop.time() - t0
        in_flight = gw.client.snapshot().in_flight
    assert took < 6.0, took
    assert len("".join(texts).split()) == 20  # the output before the stall reached the caller
    message = str(info.value)
    assert "stream stalled: no bytes for 5s after output began (stall_timeout)" in message, message
    assert "the answer is incomplete" in message
    assert [(a.model, a.decision) for _, a in seen] == [("flagship", Decision.FAIL)]
    assert in_flight == 0


# ------------------------------------------------------------ the anthropic SDK, flagship on Anthropic's wire

ANTHROPIC = {"anthropic": ("flagship",)}


def _claude_first(**kw: Any) -> Any:
    return scenario(spec("flagship", api="anthropic", **kw), spec("medium"), spec("small"))


async def test_anthropic_sdk_a_silent_route_is_left_at_the_limit_and_passed_over() -> None:
    loop = asyncio.get_running_loop()
    async with running(_claude_first(), extra=LIMITS, **ANTHROPIC) as gw, gw.anthropic() as claude:
        seen = _records(gw)
        await gw.sim_admin("faults", {"mode": "hang", "rate": 1.0, "model": FLAGSHIP})
        for n in range(2):
            t0 = loop.time()
            raw = await claude.messages.with_raw_response.create(
                model="flagship", max_tokens=50, messages=HI, stream=True
            )
            events = [e.type async for e in await raw.parse()]
            took = loop.time() - t0
            assert events[-1] == "message_stop" and raw.headers["x-capmon-model"] == "medium"
            assert took <= (5.0 + 1.0 if n == 0 else 1.0), (n, took)
        flagship = [a for _, a in seen if a.model == "flagship"]
        assert [(a.decision, a.skip) for a in flagship] == [(Decision.FALLBACK, None), (Decision.SKIP, Skip.SILENT)]


async def test_anthropic_sdk_a_slow_first_token_falls_over_and_a_stall_breaks_clearly() -> None:
    loop = asyncio.get_running_loop()
    slow = _claude_first(answer_tokens=60, per_token=0.01)
    async with running(slow, extra=LIMITS, **ANTHROPIC) as gw, gw.anthropic() as claude:
        await gw.sim_admin("faults", {"mode": "slow_first_token", "seconds": 20, "count": 1, "model": FLAGSHIP})
        t0 = loop.time()
        raw = await claude.messages.with_raw_response.create(model="flagship", max_tokens=80, messages=HI, stream=True)
        events = [e.type async for e in await raw.parse()]
        assert loop.time() - t0 < 6.0 and raw.headers["x-capmon-model"] == "medium"
        assert events[-1] == "message_stop"

        await gw.sim_admin("faults", {"mode": "stall", "tokens": 20, "seconds": 30, "count": 1, "model": FLAGSHIP})
        texts: list[str] = []
        t0 = loop.time()
        with pytest.raises(anthropic.APIError) as info:
            async with claude.messages.stream(
                model="flagship", max_tokens=80, messages=HI, extra_headers=NOT_CONTINUED
            ) as s:
                async for text in s.text_stream:
                    texts.append(text)
        took = loop.time() - t0
    assert took < 6.0, took
    assert "".join(texts)  # output came, then the clear break, never a whole-looking answer
    message = str(info.value)
    assert "stream stalled: no bytes for 5s after output began (stall_timeout)" in message, message
