"""The real boto3 bedrock-runtime client against the gateway's Bedrock routes, on models of
the simulator's other wires (OpenAI's chat completions, Anthropic's Messages): converse and
converse_stream (text, usage, stop reason), a tool use and its result (AnthropicBedrock's too,
on InvokeModel), SigV4 signatures checked with a client key as the secret, and the gateway's
errors as boto3's own exceptions (every model at capacity: ServiceUnavailableException;
rate-limited: ThrottlingException; an unknown model: ResourceNotFoundException; a wrong
signature: AccessDeniedException), a stream broken after output raised as EventStreamError
after the events it yielded.

boto3 is synchronous: each call runs in a thread while the gateway serves on the test's loop
(real time: the simulated models answer within tenths of a second)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import boto3
import botocore.config
import botocore.exceptions
import pytest

from tests.gateway.helpers import Running, running, scenario, spec

CLIENT = "sk-gw-client-bedrock-3e2d1c0b"
KEYS = 'keys = [{ env = "GW_CLIENT", alias = "team" }]'
ENVIRON = {"GW_CLIENT": CLIENT}
TWO = {"models": ("claude", "flagship"), "anthropic": ("claude",), "gateway": KEYS, "environ": ENVIRON}
HI = [{"role": "user", "content": [{"text": "Say something about capacity."}]}]
WEATHER = {
    "toolSpec": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    }
}


def bedrock(gw: Running, key_id: str = "team", secret: str = CLIENT, **headers: str) -> Any:
    """boto3's bedrock-runtime client at the gateway, signing with a client key (no retries:
    capmon's are what is tested; no validation of its own: the gateway's is tested), sending
    ``headers`` too (``x_capmon_deadline="2"``: signed with the rest)."""
    client = boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=gw.origin,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=botocore.config.Config(retries={"total_max_attempts": 1}, read_timeout=120, parameter_validation=False),
    )

    def add(request: Any, **_: Any) -> None:
        for name, value in headers.items():
            request.headers[name.replace("_", "-")] = value

    client.meta.events.register("before-sign.bedrock-runtime.*", add)
    return client


async def call(fn: Callable[..., Any], **kw: Any) -> Any:
    return await asyncio.to_thread(fn, **kw)


def headers(response: Any) -> dict[str, str]:
    return response["ResponseMetadata"]["HTTPHeaders"]


def two_providers(**kw: Any) -> Any:
    return scenario(spec("claude", api="anthropic", **kw), spec("flagship", **kw))


async def throttled(send: Callable[[Any], Awaitable[Any]], *, deadline: str) -> Any:
    """The ThrottlingException boto3 raises for what ``send`` asks of a gateway whose one
    model is rate-limited (``Retry-After: 7``) past the request's deadline."""
    limited = scenario(spec("claude", slots=0, api="anthropic", dialect="anthropic-429", hint=7.0))
    async with running(limited, models=("claude",), anthropic=("claude",), gateway=KEYS, environ=ENVIRON) as gw:
        client = bedrock(gw, x_capmon_deadline=deadline)
        with pytest.raises(client.exceptions.ThrottlingException) as info:
            await send(client)
    return info.value


async def test_converse_plain_and_streamed_on_either_wire() -> None:
    async with running(two_providers(), **TWO) as gw:
        client = bedrock(gw)
        plain = await call(client.converse, modelId="claude", messages=HI, system=[{"text": "Be brief."}])
        streamed = await call(client.converse_stream, modelId="flagship", messages=HI, inferenceConfig={"maxTokens": 5})
        events = await asyncio.to_thread(lambda: list(streamed["stream"]))
    assert plain["output"]["message"]["role"] == "assistant" and plain["stopReason"] == "end_turn"
    assert len(plain["output"]["message"]["content"][0]["text"].split()) == 12
    assert plain["usage"]["outputTokens"] == 12 and plain["usage"]["inputTokens"] > 0
    h = headers(plain)
    assert (h["x-capmon-model"], h["x-capmon-api"], h["x-capmon-fallbacks"]) == ("claude", "anthropic", "0")
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and "contentBlockDelta" in kinds and "messageStop" in kinds
    text = "".join(e["contentBlockDelta"]["delta"].get("text", "") for e in events if "contentBlockDelta" in e)
    assert len(text.split()) == 5
    (stop,) = [e["messageStop"] for e in events if "messageStop" in e]
    assert stop["stopReason"] == "max_tokens"
    assert headers(streamed)["x-capmon-model"] == "flagship"


async def test_a_tool_use_and_its_result_round_trip() -> None:
    async with running(two_providers(), **TWO) as gw:
        client = bedrock(gw)
        ask = {"role": "user", "content": [{"text": "Weather in Paris?"}]}
        tools = {"tools": [WEATHER], "toolChoice": {"any": {}}}
        done = {}
        for model in ("claude", "flagship"):
            called = await call(client.converse, modelId=model, messages=[ask], toolConfig=tools)
            assert called["stopReason"] == "tool_use", (model, called)
            (use,) = [b["toolUse"] for b in called["output"]["message"]["content"] if "toolUse" in b]
            assert use["name"] == "get_weather" and "city" in use["input"]
            result = {"toolResult": {"toolUseId": use["toolUseId"], "content": [{"json": {"forecast": "sunny"}}]}}
            turn = [ask, called["output"]["message"], {"role": "user", "content": [result]}]
            done[model] = await call(client.converse, modelId=model, messages=turn, toolConfig={"tools": [WEATHER]})
    for model, answer in done.items():
        assert answer["stopReason"] == "end_turn", (model, answer)
        assert answer["output"]["message"]["content"][0]["text"]


async def test_the_gateways_refusals_are_boto3s_own_exceptions() -> None:
    async with running(two_providers(), **TWO) as gw:
        client = bedrock(gw)
        with pytest.raises(client.exceptions.ResourceNotFoundException):
            await call(client.converse, modelId="nope", messages=HI)
        with pytest.raises(client.exceptions.AccessDeniedException):
            await call(bedrock(gw, secret="sk-not-this-one").converse, modelId="claude", messages=HI)
        with pytest.raises(client.exceptions.ValidationException) as bad:
            await call(client.converse, modelId="claude", messages=HI, inferenceConfig={"maxTokens": 0})
    assert "maxTokens" in str(bad.value)


async def test_every_model_at_capacity_is_service_unavailable_and_a_rate_limit_is_throttling() -> None:
    full = scenario(spec("claude", slots=0, api="anthropic"), spec("flagship", slots=0))
    async with running(full, **TWO) as gw:
        client = bedrock(gw, x_capmon_deadline="2")
        with pytest.raises(client.exceptions.ServiceUnavailableException) as info:
            await call(client.converse, modelId="auto", messages=HI)
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "within its deadline" in info.value.response["Error"]["Message"]

    limited = await throttled(lambda client: call(client.converse, modelId="claude", messages=HI), deadline="3")
    assert limited.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "7"


async def test_a_stream_broken_after_output_ends_with_an_exception_boto3_raises() -> None:
    async with running(two_providers(answer_tokens=40), **TWO) as gw:
        fault = {
            "mode": "stream_error",
            "after": 3,
            "dialect": "openrouter-stream",
            "model": "sim-flagship",
            "count": 1,
        }
        await gw.sim_admin("faults", fault)
        client = bedrock(gw, x_capmon_continue="false")
        streamed = await call(client.converse_stream, modelId="flagship", messages=HI)
        got: list[Any] = []

        def drain() -> None:
            for event in streamed["stream"]:
                got.append(event)

        with pytest.raises(botocore.exceptions.EventStreamError) as info:
            await asyncio.to_thread(drain)
    assert any("contentBlockDelta" in e for e in got), "the events before the break reached the caller"
    assert info.value.response["Error"]["Code"] == "throttlingException"  # the upstream's break was a 429
    assert "request req_" in info.value.response["Error"]["Message"]


async def test_anthropic_bedrock_reaches_every_model_through_invoke_model() -> None:
    async with running(two_providers(), **TWO) as gw:
        claude = anthropic.AsyncAnthropicBedrock(
            aws_access_key="team", aws_secret_key=CLIENT, aws_region="us-east-1", base_url=gw.origin, max_retries=0
        )
        raw = await claude.messages.with_raw_response.create(
            model="flagship", max_tokens=64, messages=[{"role": "user", "content": "Say hi"}]
        )
        message = await raw.parse()
        async with claude.messages.stream(
            model="claude", max_tokens=5, messages=[{"role": "user", "content": "Say hi"}]
        ) as stream:
            texts = [t async for t in stream.text_stream]
            final = await stream.get_final_message()
        wrong = anthropic.AsyncAnthropicBedrock(
            aws_access_key="team",
            aws_secret_key="sk-not-this-one",
            aws_region="us-east-1",
            base_url=gw.origin,
            max_retries=0,
        )
        with pytest.raises(anthropic.APIStatusError) as refused:
            await wrong.messages.create(model="claude", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    # Messages on Bedrock's InvokeModel, served by a model on the OpenAI wire, answered in Anthropic's shape
    assert raw.headers["x-capmon-api"] == "openai" and message.stop_reason == "end_turn"
    assert message.content[0].type == "text" and message.content[0].text
    assert len("".join(texts).split()) == 5 and final.stop_reason == "max_tokens"
    assert refused.value.status_code == 401


async def test_anthropic_bedrock_calls_a_tool_and_reads_its_result_through_invoke_model() -> None:
    tool = {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    ask = [{"role": "user", "content": "What is the weather in Oslo? Use get_weather."}]
    async with running(two_providers(), **TWO) as gw:
        claude = anthropic.AsyncAnthropicBedrock(
            aws_access_key="team", aws_secret_key=CLIENT, aws_region="us-east-1", base_url=gw.origin, max_retries=0
        )
        served = {}
        for model in ("claude", "flagship"):  # Anthropic's wire, and OpenAI's chat through the hub
            called = await claude.messages.create(
                model=model, max_tokens=64, messages=ask, tools=[tool], tool_choice={"type": "any"}
            )
            use = next(b for b in called.content if b.type == "tool_use")
            answered = await claude.messages.create(
                model=model,
                max_tokens=64,
                tools=[tool],
                messages=[
                    *ask,
                    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in called.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "12 C"}]},
                ],
            )
            served[model] = (called, use, answered)
    for model, (called, use, answered) in served.items():
        assert called.stop_reason == "tool_use", model
        assert use.name == "get_weather" and isinstance(use.input, dict) and isinstance(use.input.get("city"), str)
        text = "".join(b.text for b in answered.content if b.type == "text")
        assert answered.stop_reason == "end_turn" and "12 C" in text, model


async def test_invoke_model_fails_in_bedrocks_shape_for_boto3_and_anthropic_bedrock() -> None:
    """InvokeModel's failures are Bedrock's, as on Bedrock itself: boto3's ``invoke_model``
    raises its own exception classes, and AnthropicBedrock (which reads the status) its."""
    say = [{"role": "user", "content": "hi"}]
    hi = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 8, "messages": say})
    full = scenario(spec("claude", slots=0, api="anthropic"), spec("flagship", slots=0))
    async with running(full, **TWO) as gw:
        client = bedrock(gw, x_capmon_deadline="1")
        with pytest.raises(client.exceptions.ServiceUnavailableException) as plain:
            await call(client.invoke_model, modelId="auto", body=hi)
        with pytest.raises(client.exceptions.ServiceUnavailableException) as streamed:
            await call(client.invoke_model_with_response_stream, modelId="claude", body=hi)
        claude = anthropic.AsyncAnthropicBedrock(
            aws_access_key="team",
            aws_secret_key=CLIENT,
            aws_region="us-east-1",
            base_url=gw.origin,
            max_retries=0,
            default_headers={"x-capmon-deadline": "1"},
        )
        with pytest.raises(anthropic.InternalServerError) as sdk:
            await claude.messages.create(model="claude", max_tokens=8, messages=say)
    for info in (plain, streamed):
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert "within its deadline" in info.value.response["Error"]["Message"]
    assert sdk.value.status_code == 503 and sdk.value.response.headers["x-amzn-errortype"].startswith(
        "ServiceUnavailableException"
    )
    assert isinstance(sdk.value.body, dict) and "within its deadline" in sdk.value.body["message"]

    limited = await throttled(lambda client: call(client.invoke_model, modelId="claude", body=hi), deadline="2")
    assert limited.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "7"
