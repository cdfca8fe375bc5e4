"""Real providers' stream shapes and quirks through the FallbackClient, over real HTTP."""

from __future__ import annotations

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.failure import Kind
from tests.core.wire_shapes import STREAMS, UNSUPPORTED, WEATHER_ARGS, Shape, chunk, role, sse, text
from tests.support.configs import ENV, three_models
from tests.support.scripted import Reply, Script, ok, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

NORMAL = sse(role(), text("from "), text("medium"), chunk({}, "stop"))


def stream_reply(body: bytes) -> Reply:
    return Reply(200, body, headers={"content-type": "text/event-stream"})


def flagship_serves(script: Script, shape: Shape) -> None:
    # The shape on the flagship's first request, a normal stream after (a retry of the same model).
    script.set("flagship", lambda n, body: stream_reply(shape.body if n == 1 else NORMAL))
    script.set("medium", lambda n, body: stream_reply(NORMAL))


@pytest.mark.parametrize("shape", STREAMS, ids=[s.name for s in STREAMS])
async def test_stream_shapes_through_the_client(shape: Shape) -> None:
    script = Script()
    flagship_serves(script, shape)
    bus = ev.EventBus()
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV, bus=bus) as client:
        got: list[dict] = []
        error: RequestFailed | None = None
        try:
            # opted out of continuing: a break after output ends the stream (tests/gateway/test_continuation.py)
            async for c in client.stream_chunks("hi", continuation=False):
                got.append(c)
        except RequestFailed as e:
            error = e
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in got if c.get("choices"))
        flagship = client.snapshot().targets[0]
        if shape.kind is None:
            assert error is None
            assert content == shape.text
            assert script.served("flagship") == 1 and script.served("medium") == 0
            if shape.tool_calls:
                names = [
                    d["function"]["name"]
                    for c in got
                    for d in c["choices"][0]["delta"].get("tool_calls") or []
                    if "name" in d.get("function", {})
                ]
                assert names == [t["function"]["name"] for t in shape.tool_calls]
        elif shape.after_output:
            assert error is not None and error.failure.kind is shape.kind
            assert "after output was sent" in str(error)
            assert content == shape.text  # what was shown stays shown; nothing is retried
            assert script.served() == 1
        else:
            assert error is None  # retried or fell back before any output
            assert content in ("from medium",)
            if shape.kind is Kind.CAPACITY:
                assert script.served("medium") == 1  # fell back at once
                assert flagship.consecutive_failures == 1  # and the flagship's breaker counted it
            else:
                assert script.served("flagship") == 2 and script.served("medium") == 0  # the same model again
        failed = [e for e in bus.recent(types=[ev.AttemptFailed])]
        assert len(failed) == (0 if shape.kind is None else 1)


async def test_tool_calls_survive_plain_and_streamed_answers() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER_ARGS}}
    plain = ok("flagship")
    plain.body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
    plain.body["choices"][0]["finish_reason"] = "tool_calls"
    streamed = next(s for s in STREAMS if s.name == "tool-call")
    script = Script()
    script.set("flagship", lambda n, body: plain if not body.get("stream") else stream_reply(streamed.body))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        result = await client.chat("weather?", tools=tools, tool_choice="required")
        assert result.tool_calls == [call]
        pieces = [c async for c in client.stream_chunks("weather?", tools=tools, tool_choice="required")]
        texts = [t async for t in client.stream("weather?", tools=tools)]
    sent = [s.body for s in script.seen]
    assert all(b["tools"] == tools for b in sent)
    assert sent[0]["tool_choice"] == "required" and "stream" not in sent[0] and sent[1]["stream"] is True
    args = "".join(
        d["function"].get("arguments", "") for c in pieces for d in c["choices"][0]["delta"].get("tool_calls") or []
    )
    assert args == WEATHER_ARGS
    assert texts == []  # no text in a tool call: stream() yields nothing, and does not fail


@pytest.mark.parametrize(
    "name,status,body,refused",
    [u for u in UNSUPPORTED if u[3] == "max_tokens"],
    ids=[u[0] for u in UNSUPPORTED if u[3] == "max_tokens"],
)
async def test_a_model_that_refuses_max_tokens_is_sent_max_completion_tokens(name, status, body, refused) -> None:
    script = Script()
    script.set("flagship", lambda n, b: Reply(status, body) if "max_tokens" in b else ok("flagship"))
    bus = ev.EventBus()
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV, bus=bus) as client:
        first = await client.chat("hi", max_tokens=64)
        second = await client.chat("again", max_tokens=64)
        snap = client.snapshot()
    assert first.model == second.model == "flagship"
    sent = [s.body for s in script.seen]
    assert "max_tokens" in sent[0] and sent[1].get("max_completion_tokens") == 64 and "max_tokens" not in sent[1]
    assert sent[2].get("max_completion_tokens") == 64  # remembered for the model
    assert [a.decision for a in first.attempts] == ["retry", "ok"]
    learned = bus.recent(types=[ev.TokenParamLearned])
    assert len(learned) == 1 and learned[0].model == "flagship" and learned[0].param == "max_completion_tokens"
    assert snap.targets[0].token_param == "max_completion_tokens" and snap.targets[0].consecutive_failures == 0


async def test_the_token_parameter_is_switched_once_per_request_not_forever() -> None:
    refuses_both = Reply(
        400,
        {
            "error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model.",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "unsupported_parameter",
            }
        },
    )
    script = Script()
    script.always("flagship", refuses_both)
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        with pytest.raises(RequestFailed) as info:
            await client.chat("hi")
    assert info.value.failure.kind is Kind.BAD_REQUEST and script.served() == 2


async def test_a_configured_token_parameter_is_sent_from_the_start() -> None:
    script = Script()
    async with serve(script) as url:
        cfg = three_models(url)
        import dataclasses

        models = (dataclasses.replace(cfg.models[0], token_param="max_completion_tokens"), *cfg.models[1:])
        async with FallbackClient(dataclasses.replace(cfg, models=models), environ=ENV) as client:
            await client.chat("hi", max_tokens=10)
    assert script.seen[0].body["max_completion_tokens"] == 10 and "max_tokens" not in script.seen[0].body


async def test_an_answer_past_the_size_cap_is_oversized_and_falls_back() -> None:
    big = ok("flagship", text="x" * 50_000)
    big_stream = stream_reply(sse(role(), *[text("y" * 1000) for _ in range(40)], chunk({}, "stop")))
    script = Script()
    script.set("flagship", lambda n, body: big_stream if body.get("stream") else big)
    script.set("medium", lambda n, body: stream_reply(NORMAL) if body.get("stream") else ok("medium"))
    bus = ev.EventBus()
    async with serve(script) as url:
        cfg = three_models(url, extra="[client]\nmax_response_bytes = 20000\n")
        async with FallbackClient(cfg, environ=ENV, bus=bus) as client:
            result = await client.chat("hi")
            streamed: list[str] = []
            error: RequestFailed | None = None
            try:
                async for piece in client.stream("hi"):
                    streamed.append(piece)
            except RequestFailed as e:
                error = e
    assert result.model == "medium" and result.attempts[0].kind is Kind.OVERSIZED
    assert "cap" in result.attempts[0].reason
    failed = bus.recent(types=[ev.AttemptFailed])
    assert [(e.model, e.kind) for e in failed] == [("flagship", "oversized")] * 2
    if error is None:  # the bytes past the cap arrived before any output: it fell back, unseen
        assert "".join(streamed) == "from medium"
    else:  # output had reached the caller: the stream ends with the error, never as complete
        assert error.failure.kind is Kind.OVERSIZED and 0 < len("".join(streamed)) <= 20_000
