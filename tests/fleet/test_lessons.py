"""What a provider taught one process about a feature a deployment lacks (a 400 that says
the model does not support tools), every process of the fleet knows: at once by pub/sub,
and from Redis for a process that joins later; one learned while Redis was lost reaches
the fleet when the process rejoins."""

from __future__ import annotations

from typing import Any

from capmon.core.types import events as ev
from capmon.core.types.capability import Feature
from capmon.core.types.result import Skip
from capmon.fleet import codec
from tests.fleet.helpers import client, fleet_config, store, until
from tests.support.scripted import Reply, Script, ok, serve

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
NO_TOOLS = Reply(
    400,
    {"error": {"message": "flagship does not support tools", "type": "invalid_request_error", "code": None}},
)


def no_tools_on_flagship(script: Script) -> None:
    script.set("flagship", lambda n, body: NO_TOOLS if body.get("tools") else ok("flagship"))


async def weather(c: Any) -> Any:
    return await c.chat("weather in Oslo?", tools=TOOLS)


async def test_a_lesson_one_process_learned_every_process_uses(redis_url: str, namespace: str) -> None:
    script = Script()
    no_tools_on_flagship(script)
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace)
        bus = ev.EventBus()
        async with client(cfg) as a, client(cfg, bus=bus) as b:
            first = await weather(a)
            await until(lambda: bool(store(b).lessons.lacks("flagship@ep")))
            second = await weather(b)
            plain = await b.chat("hi")
            async with client(cfg) as late:  # joins after the lesson: reads it from Redis
                await until(lambda: bool(store(late).lessons.lacks("flagship@ep")))
                third = await weather(late)
            snap = b.snapshot()
    assert first.model == "medium" and [a.model for a in first.attempts if a.skip is None] == ["flagship", "medium"]
    for r in (second, third):
        assert r.model == "medium" and [(s.model, s.skip) for s in r.skipped] == [("flagship", Skip.INCAPABLE)]
    assert plain.model == "flagship"  # what needs no tools still goes there
    assert script.served("flagship") == 2  # the first request's 400 and the plain one: nobody asked it again
    [heard] = bus.recent(types=[ev.CapabilityLearned])
    assert (heard.model, heard.endpoint, heard.feature) == ("flagship", "ep", Feature.TOOLS)
    assert "another process" in heard.reason
    lacks = {t.model: dict(t.lacks) for t in snap.targets}
    assert "does not support tools" in lacks["flagship"]["tools"]


async def test_a_lesson_learned_while_redis_was_lost_reaches_the_fleet_on_rejoin(
    redis_url: str, namespace: str
) -> None:
    script = Script()
    no_tools_on_flagship(script)
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace)
        async with client(cfg) as a, client(cfg) as b:
            sa = store(a)
            sa.lost(ConnectionError("test: Redis lost"))
            await until(lambda: not sa.link.ok)
            await weather(a)
            assert sa.lessons.lacks("flagship@ep") and not store(b).lessons.lacks("flagship@ep")
            await until(lambda: sa.link.ok, timeout=10.0)  # rejoined
            await until(lambda: bool(store(b).lessons.lacks("flagship@ep")))
            fields = await sa.link.client.hgetall(sa.keys.lessons)
    assert codec.lessons(fields, "lessons") == [("flagship@ep", Feature.TOOLS, "flagship does not support tools")]


def test_garbage_in_a_lesson_is_named_never_taken() -> None:
    good = '{"k": "lesson", "d": "flagship@ep|tools", "why": "no tools", "origin": "p"}'
    assert codec.message(good, "events") == codec.Lesson("flagship@ep", Feature.TOOLS, "no tools", "p")
    for bad in (
        '{"k": "lesson", "d": "flagship@ep|teleport", "why": "x"}',
        '{"k": "lesson", "d": "flagship@ep", "why": "x"}',
        '{"k": "lesson", "d": "flagship@ep|tools", "why": 3}',
    ):
        try:
            codec.message(bad, "events")
        except codec.Garbage:
            continue
        raise AssertionError(f"taken: {bad}")
