"""AWS Bedrock's Converse on the simulator, through the real boto3 ``bedrock-runtime`` client
over loopback (SigV4-signed, the model id URL-encoded; each call in a thread, as boto3
blocks): plain and streamed answers, tool rounds, usage and stop reasons; every error raised
as boto3's own exception (its code from ``x-amzn-ErrorType``); the exceptions inside an event
stream raised as botocore's EventStreamError, after the events before them. The event
stream's framing is read back with botocore's own decoder, which checks the CRCs. The
anthropic SDK's AnthropicBedrock reaches Claude by InvokeModel and
InvokeModelWithResponseStream, Anthropic's body and events inside Bedrock's framing."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable
from typing import Any, TypeVar, cast

import anthropic
import boto3
import botocore.config
import botocore.session
import httpx
import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer
from botocore.exceptions import ClientError, EventStreamError

from capmon.core.providers import aws_frames as eventstream
from capmon.core.providers import aws_sigv4 as sigv4
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.faults import parse_rules
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import SimHandle

PROFILE = "us.anthropic.sim-claude-v1:0"
BASE_ID = "anthropic.sim-claude-v1:0"
HELLO: Any = [{"role": "user", "content": [{"text": "Say something about capacity."}]}]
WEATHER: Any = {
    "tools": [
        {
            "toolSpec": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "inputSchema": {
                    "json": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
                },
            }
        }
    ]
}
T = TypeVar("T")
# One botocore session for the module: the service model is loaded once.
_BOTOCORE = botocore.session.get_session()


def _model(name: str, api: str = "bedrock", **kw: Any) -> ModelSpec:
    settings: dict[str, Any] = dict(
        slots=2, base_latency=0.001, per_token=0.0, noise=0.0, answer_tokens=10, context_window=2000
    )
    return ModelSpec(name=name, api=api, **{**settings, **kw})


SCENARIO = Scenario(
    name="bedrock",
    models=(_model(PROFILE), _model("sim-claude", "anthropic+bedrock"), _model("openai-only", "openai")),
)


@pytest.fixture
def sim_scenario() -> Scenario:
    return SCENARIO


def client(sim: SimHandle, key: str = SIMULATOR_DEMO_KEY, secret: str | None = None) -> Any:
    """boto3's bedrock-runtime client on the simulator: the key as the access key id, its
    secret the same string; no retries (one attempt in all: in botocore's legacy mode
    ``max_attempts`` counts the retries), so a test sees each answer."""
    session = boto3.session.Session(botocore_session=_BOTOCORE)
    return session.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=sim.origin,
        aws_access_key_id=key,
        aws_secret_access_key=secret or key,
        config=botocore.config.Config(retries={"total_max_attempts": 1}, proxies={}),
    )


async def call(fn: Callable[[], T]) -> T:
    """A blocking boto3 call, off the loop the simulator serves on."""
    return await asyncio.to_thread(fn)


def drain(response: dict[str, Any]) -> tuple[list[dict[str, Any]], Exception | None]:
    """A ConverseStream's events, and the exception that ended it (None: it ended whole)."""
    events: list[dict[str, Any]] = []
    try:
        for e in response["stream"]:
            events.append(e)
    except Exception as e:  # noqa: BLE001 - returned for the test to look at
        return events, e
    return events, None


async def stream(c: Any, **kw: Any) -> tuple[list[dict[str, Any]], Exception | None]:
    return await call(lambda: drain(c.converse_stream(**kw)))


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["contentBlockDelta"]["delta"].get("text", "") for e in events if "contentBlockDelta" in e)


# ---------------------------------------------------------------- answers


async def test_converse_plain_usage_and_metrics(sim: SimHandle) -> None:
    c = client(sim)
    r = await call(lambda: c.converse(modelId=PROFILE, messages=HELLO, system=[{"text": "Be brief."}]))
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    message = r["output"]["message"]
    assert message["role"] == "assistant" and len(message["content"][0]["text"].split()) == 10
    assert r["stopReason"] == "end_turn"
    usage = r["usage"]
    assert usage["outputTokens"] == 10 and usage["inputTokens"] > 0
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    assert r["metrics"]["latencyMs"] >= 0
    assert sim.simulator.stats()["models"][PROFILE]["completed"] == 1


async def test_stop_reasons_max_tokens_and_stop_sequence(sim: SimHandle) -> None:
    c = client(sim)
    r = await call(lambda: c.converse(modelId=PROFILE, messages=HELLO, inferenceConfig={"maxTokens": 3}))
    assert r["stopReason"] == "max_tokens" and r["usage"]["outputTokens"] == 3
    assert len(r["output"]["message"]["content"][0]["text"].split()) == 3
    # Every answer's second word follows a space: the answer stops after its first word.
    config = {"stopSequences": [" "], "temperature": 0.2, "topP": 0.9}
    r = await call(lambda: c.converse(modelId=PROFILE, messages=HELLO, inferenceConfig=config))
    text = r["output"]["message"]["content"][0]["text"]
    assert r["stopReason"] == "stop_sequence" and text and " " not in text and r["usage"]["outputTokens"] == 1
    events, _ = await stream(c, modelId=PROFILE, messages=HELLO, inferenceConfig=config)
    assert events[-2]["messageStop"]["stopReason"] == "stop_sequence" and " " not in text_of(events)


async def test_converse_stream_events(sim: SimHandle) -> None:
    c = client(sim)
    events, error = await stream(c, modelId=PROFILE, messages=HELLO)
    assert error is None
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and events[0]["messageStart"]["role"] == "assistant"
    assert kinds[-3:] == ["contentBlockStop", "messageStop", "metadata"]
    assert set(kinds[1:-3]) == {"contentBlockDelta"}
    assert len(text_of(events).split()) == 10
    assert events[-2]["messageStop"]["stopReason"] == "end_turn"
    usage = events[-1]["metadata"]["usage"]
    assert usage["outputTokens"] == 10 and usage["totalTokens"] == usage["inputTokens"] + 10
    assert "latencyMs" in events[-1]["metadata"]["metrics"]
    events, _ = await stream(c, modelId=PROFILE, messages=HELLO, inferenceConfig={"maxTokens": 2})
    assert events[-2]["messageStop"]["stopReason"] == "max_tokens" and len(text_of(events).split()) == 2


async def test_a_tool_use_then_a_tool_result_round(sim: SimHandle) -> None:
    c = client(sim)
    ask: Any = [{"role": "user", "content": [{"text": "Call get_weather for Paris."}]}]
    r = await call(lambda: c.converse(modelId=PROFILE, messages=ask, toolConfig=WEATHER))
    assert r["stopReason"] == "tool_use"
    (block,) = r["output"]["message"]["content"]
    use = block["toolUse"]
    assert use["name"] == "get_weather" and use["input"] == {"city": "sample"} and use["toolUseId"]
    history = [
        *ask,
        r["output"]["message"],
        {
            "role": "user",
            "content": [{"toolResult": {"toolUseId": use["toolUseId"], "content": [{"text": "rain"}]}}],
        },
    ]
    answer = await call(lambda: c.converse(modelId=PROFILE, messages=history, toolConfig=WEATHER))
    assert answer["stopReason"] == "end_turn"
    assert answer["output"]["message"]["content"][0]["text"].startswith("The tool returned: rain")


async def test_tool_use_streamed_and_tool_choice(sim: SimHandle) -> None:
    c = client(sim)
    forced = {**WEATHER, "toolChoice": {"tool": {"name": "get_weather"}}}
    events, error = await stream(c, modelId=PROFILE, messages=HELLO, toolConfig=forced)
    assert error is None
    start = next(e["contentBlockStart"]["start"]["toolUse"] for e in events if "contentBlockStart" in e)
    assert start["name"] == "get_weather" and start["toolUseId"].startswith("tooluse_")
    pieces = [e["contentBlockDelta"]["delta"]["toolUse"]["input"] for e in events if "contentBlockDelta" in e]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"city": "sample"}
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"
    auto = await call(lambda: c.converse(modelId=PROFILE, messages=HELLO, toolConfig=WEATHER))
    assert auto["stopReason"] == "end_turn"  # nothing asked for a tool
    anyone = await call(
        lambda: c.converse(modelId=PROFILE, messages=HELLO, toolConfig={**WEATHER, "toolChoice": {"any": {}}})
    )
    assert anyone["stopReason"] == "tool_use"


async def test_one_model_on_anthropics_wire_and_bedrocks(sim: SimHandle, http: httpx.AsyncClient) -> None:
    c = client(sim)
    await call(lambda: c.converse(modelId="sim-claude", messages=HELLO))
    r = await http.post(
        f"{sim.origin}/v1/messages",
        json={"model": "sim-claude", "max_tokens": 20, "messages": [{"role": "user", "content": "Hi."}]},
        headers={"x-api-key": SIMULATOR_DEMO_KEY, "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 200
    assert sim.simulator.stats()["models"]["sim-claude"]["completed"] == 2


async def test_a_bedrock_api_key_as_bearer(sim: SimHandle, http: httpx.AsyncClient) -> None:
    url = f"{sim.origin}/model/{PROFILE.replace(':', '%3A')}/converse"
    r = await http.post(url, json={"messages": HELLO}, headers={"Authorization": f"Bearer {SIMULATOR_DEMO_KEY}"})
    assert r.status_code == 200 and r.json()["stopReason"] == "end_turn"
    r = await http.post(url, json={"messages": HELLO}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 403 and r.headers["x-amzn-ErrorType"].startswith("UnrecognizedClientException:")
    r = await http.post(url, json={"messages": HELLO})
    assert r.status_code == 403 and r.headers["x-amzn-ErrorType"].startswith("AccessDeniedException:")
    assert set(r.json()) == {"message"}


# ---------------------------------------------------------------- errors


def _error(info: pytest.ExceptionInfo[ClientError]) -> tuple[int, str, str]:
    response: Any = info.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"], response["Error"]["Message"]


async def test_a_full_model_throttles_and_its_other_dialects(sim: SimHandle) -> None:
    c = client(sim)
    sim.simulator.configure(PROFILE, slots=0)  # the wire's own dialect: bedrock-429
    with pytest.raises(c.exceptions.ThrottlingException) as info:
        await call(lambda: c.converse(modelId=PROFILE, messages=HELLO))
    assert _error(info) == (429, "ThrottlingException", "Too many requests, please wait before trying again.")
    sim.simulator.configure(PROFILE, dialect="bedrock-503")
    with pytest.raises(c.exceptions.ServiceUnavailableException) as info:
        await call(lambda: c.converse(modelId=PROFILE, messages=HELLO))
    assert _error(info) == (503, "ServiceUnavailableException", "Bedrock is unable to process your request.")
    sim.simulator.configure(PROFILE, dialect="bedrock-not-ready")
    with pytest.raises(c.exceptions.ModelNotReadyException) as info:
        await call(lambda: c.converse(modelId=PROFILE, messages=HELLO))
    assert _error(info)[:2] == (429, "ModelNotReadyException")
    sim.simulator.configure(PROFILE, dialect="bedrock-quota")
    with pytest.raises(c.exceptions.ServiceQuotaExceededException) as info:
        await call(lambda: c.converse_stream(modelId=PROFILE, messages=HELLO))
    assert _error(info)[:2] == (400, "ServiceQuotaExceededException")


@pytest.mark.parametrize(
    ("status", "code", "wire_status"),
    [
        (408, "ModelTimeoutException", 408),
        (424, "ModelErrorException", 424),
        (500, "InternalServerException", 500),
        (403, "AccessDeniedException", 403),
        (401, "UnrecognizedClientException", 403),
        (529, "ServiceUnavailableException", 503),
    ],
)
async def test_error_faults_in_bedrocks_shapes(sim: SimHandle, status: int, code: str, wire_status: int) -> None:
    c = client(sim)
    sim.simulator.faults.set(parse_rules({"mode": "error", "status": status, "count": 1}))
    with pytest.raises(ClientError) as info:
        await call(lambda: c.converse(modelId=PROFILE, messages=HELLO))
    assert _error(info)[:2] == (wire_status, code)
    if hasattr(c.exceptions, code):  # boto3's own exception where bedrock-runtime models it
        assert isinstance(info.value, getattr(c.exceptions, code))


async def test_validation_errors(sim: SimHandle) -> None:
    c = client(sim)
    long: Any = [{"role": "user", "content": [{"text": "word " * 10_000}]}]
    with pytest.raises(c.exceptions.ValidationException) as info:
        await call(lambda: c.converse(modelId=PROFILE, messages=long))
    assert _error(info) == (400, "ValidationException", "Input is too long for requested model.")
    with pytest.raises(c.exceptions.ValidationException) as info:
        await call(lambda: c.converse(modelId=BASE_ID, messages=HELLO))
    assert _error(info)[2] == (
        f"Invocation of model ID {BASE_ID} with on-demand throughput isn't supported. Retry your request with the "
        f"ID or ARN of an inference profile that contains this model."
    )
    starts_with_the_model: Any = [{"role": "assistant", "content": [{"text": "Hi."}]}]
    with pytest.raises(c.exceptions.ValidationException) as info:
        await call(lambda: c.converse(modelId=PROFILE, messages=starts_with_the_model))
    assert "must start with a user message" in _error(info)[2]
    result_without_tools: Any = [
        {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "x"}]}}]}
    ]
    with pytest.raises(c.exceptions.ValidationException) as info:
        await call(lambda: c.converse(modelId=PROFILE, messages=result_without_tools))
    assert "toolConfig" in _error(info)[2]


async def test_unknown_model_and_other_wires_models_are_404(sim: SimHandle) -> None:
    c = client(sim)
    for model in ("no-such-model", "openai-only"):
        with pytest.raises(c.exceptions.ResourceNotFoundException) as info:
            await call(lambda model=model: c.converse(modelId=model, messages=HELLO))  # type: ignore[misc]
        assert _error(info)[:2] == (404, "ResourceNotFoundException")


async def test_an_arn_names_the_profile(sim: SimHandle) -> None:
    c = client(sim)
    arn = f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/{PROFILE}"
    r = await call(lambda: c.converse(modelId=arn, messages=HELLO))
    assert r["stopReason"] == "end_turn"


async def test_credentials_checked(sim: SimHandle) -> None:
    stranger = client(sim, key="AKIAUNKNOWN")
    with pytest.raises(ClientError) as info:
        await call(lambda: stranger.converse(modelId=PROFILE, messages=HELLO))
    assert _error(info) == (
        403,
        "UnrecognizedClientException",
        "The security token included in the request is invalid.",
    )
    forged = client(sim, secret="not-the-secret")
    with pytest.raises(ClientError) as info:
        await call(lambda: forged.converse(modelId=PROFILE, messages=HELLO))
    assert _error(info)[:2] == (403, "InvalidSignatureException")
    stats = sim.simulator.stats()
    assert stats["totals"]["rejected"]["auth"] == 2 and stats["models"][PROFILE]["requests"] == 0


# ---------------------------------------------------------------- errors inside the stream


async def test_in_stream_throttling_before_output(sim: SimHandle, http: httpx.AsyncClient) -> None:
    c = client(sim)
    r = await http.post(f"{sim.admin_url}/models/{PROFILE}", json={"slots": 0, "dialect": "bedrock-stream"})
    assert r.status_code == 200 and r.json()["dialect"] == "bedrock-stream"
    events, error = await stream(c, modelId=PROFILE, messages=HELLO)
    assert events == [] and isinstance(error, EventStreamError)
    assert error.response["Error"] == {
        "Code": "throttlingException",
        "Message": "Too many requests, please wait before trying again.",
    }
    # a plain request gets the HTTP error the frame stands for
    with pytest.raises(c.exceptions.ThrottlingException):
        await call(lambda: c.converse(modelId=PROFILE, messages=HELLO))


@pytest.mark.parametrize(
    ("dialect", "code"),
    [
        ("bedrock-stream", "throttlingException"),
        ("bedrock-stream-503", "serviceUnavailableException"),
        ("bedrock-stream-error", "modelStreamErrorException"),
        ("bedrock-stream-frame", "ThrottlingException"),  # :message-type: error
    ],
)
async def test_in_stream_exception_after_output(sim: SimHandle, dialect: str, code: str) -> None:
    c = client(sim)
    sim.simulator.faults.set(parse_rules({"mode": "stream_error", "after": 2, "dialect": dialect, "count": 1}))
    events, error = await stream(c, modelId=PROFILE, messages=HELLO)
    assert [next(iter(e)) for e in events] == ["messageStart", "contentBlockDelta", "contentBlockDelta"]
    assert text_of(events)
    assert isinstance(error, EventStreamError) and error.response["Error"]["Code"] == code
    assert not any("messageStop" in e for e in events)  # never a truncated success


async def test_stream_cut_and_broken_tool_args(sim: SimHandle) -> None:
    c = client(sim)
    sim.simulator.faults.set(parse_rules({"mode": "stream_cut", "after": 1, "count": 1}))
    events, error = await stream(c, modelId=PROFILE, messages=HELLO)
    assert error is None and [next(iter(e)) for e in events] == ["messageStart", "contentBlockDelta"]
    sim.simulator.faults.set(parse_rules({"mode": "broken_tool_args", "count": 1}))
    r = await call(lambda: c.converse(modelId=PROFILE, messages=HELLO, toolConfig=WEATHER))
    assert r["stopReason"] == "malformed_tool_use" and r["output"]["message"]["content"] == []


# ---------------------------------------------------------------- the framing


async def test_frames_read_back_by_botocore(sim: SimHandle, http: httpx.AsyncClient) -> None:
    """The raw bytes: botocore's decoder checks each frame's CRCs; every event carries its padding."""
    url = f"{sim.origin}/model/{PROFILE.replace(':', '%3A')}/converse-stream"
    r = await http.post(url, json={"messages": HELLO}, headers={"Authorization": f"Bearer {SIMULATOR_DEMO_KEY}"})
    assert r.headers["content-type"] == eventstream.MEDIA_TYPE
    decoder = EventStreamBuffer()
    decoder.add_data(r.content)
    messages = list(decoder)
    assert len(messages) >= 6
    for m in messages:
        assert m.headers[":message-type"] == "event" and m.headers[":content-type"] == "application/json"
        payload = json.loads(m.payload)
        assert isinstance(payload.pop("p"), str) and payload
    # split anywhere, the frames read back the same
    for at in range(1, len(r.content)):
        decoder = EventStreamBuffer()
        decoder.add_data(r.content[:at])
        head = list(decoder)
        decoder.add_data(r.content[at:])
        assert [m.payload for m in [*head, *decoder]] == [m.payload for m in messages]
    broken = bytearray(r.content)
    broken[-1] ^= 0xFF  # the last frame's message CRC
    decoder = EventStreamBuffer()
    decoder.add_data(bytes(broken))
    with pytest.raises(ChecksumMismatch):
        list(decoder)


def test_a_frame_byte_for_byte() -> None:
    frame = eventstream.frame({":event-type": "x"}, b"{}")
    header = b"\x0b:event-type\x07\x00\x01x"
    assert frame[:4] == (12 + len(header) + 2 + 4).to_bytes(4, "big")
    assert frame[4:8] == len(header).to_bytes(4, "big")
    assert frame[8:12] == zlib.crc32(frame[:8]).to_bytes(4, "big")
    assert frame[12:-4] == header + b"{}"
    assert frame[-4:] == zlib.crc32(frame[:-4]).to_bytes(4, "big")


# ---------------------------------------------------------------- InvokeModel: the anthropic SDK's AnthropicBedrock


def claude(sim: SimHandle, key: str = SIMULATOR_DEMO_KEY) -> anthropic.AsyncAnthropicBedrock:
    """AnthropicBedrock signs with SigV4 through botocore, as boto3 does."""
    return anthropic.AsyncAnthropicBedrock(
        aws_access_key=key, aws_secret_key=key, aws_region="us-east-1", base_url=sim.origin, max_retries=0
    )


CLAUDE_HELLO: Any = [{"role": "user", "content": "Say something about capacity."}]


async def test_anthropic_bedrock_plain_streamed_and_tools(sim: SimHandle) -> None:
    async with claude(sim) as c:
        m = await c.messages.create(model=PROFILE, max_tokens=50, messages=CLAUDE_HELLO)
        assert m.stop_reason == "end_turn" and m.usage.output_tokens == 10 and m.model == PROFILE
        async with c.messages.stream(model=PROFILE, max_tokens=50, messages=CLAUDE_HELLO) as s:
            text = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
        assert len(text.split()) == 10 and final.stop_reason == "end_turn"
        tool: Any = {"name": "get_weather", "input_schema": WEATHER["tools"][0]["toolSpec"]["inputSchema"]["json"]}
        ask: Any = [{"role": "user", "content": "Call get_weather for Paris."}]
        called = await c.messages.create(model=PROFILE, max_tokens=50, messages=ask, tools=[tool])
        assert called.stop_reason == "tool_use" and called.content[0].type == "tool_use"
    assert sim.simulator.stats()["models"][PROFILE]["completed"] == 3


async def test_anthropic_bedrock_errors_are_bedrocks(sim: SimHandle) -> None:
    async with claude(sim) as c:
        sim.simulator.configure(PROFILE, slots=0)
        with pytest.raises(anthropic.RateLimitError) as limited:
            await c.messages.create(model=PROFILE, max_tokens=50, messages=CLAUDE_HELLO)
        assert limited.value.response.headers["x-amzn-errortype"].startswith("ThrottlingException:")
        assert limited.value.body == {"message": "Too many requests, please wait before trying again."}
        sim.simulator.configure(PROFILE, reset_schedule=True)
        with pytest.raises(anthropic.BadRequestError) as profile:
            await c.messages.create(model=BASE_ID, max_tokens=50, messages=CLAUDE_HELLO)
        assert "inference profile" in cast(Any, profile.value.body)["message"]
        with pytest.raises(anthropic.NotFoundError):
            await c.messages.create(model="openai-only", max_tokens=50, messages=CLAUDE_HELLO)
    async with claude(sim, key="AKIAUNKNOWN") as stranger:
        with pytest.raises(anthropic.PermissionDeniedError) as denied:
            await stranger.messages.create(model=PROFILE, max_tokens=50, messages=CLAUDE_HELLO)
        assert denied.value.response.headers["x-amzn-errortype"].startswith("UnrecognizedClientException:")


async def test_anthropic_bedrock_in_stream_error_after_output(sim: SimHandle) -> None:
    sim.simulator.faults.set(
        parse_rules({"mode": "stream_error", "after": 2, "dialect": "anthropic-stream", "count": 1})
    )
    seen: list[str] = []
    async with claude(sim) as c:
        with pytest.raises(anthropic.APIStatusError) as info:
            async with c.messages.stream(model=PROFILE, max_tokens=50, messages=CLAUDE_HELLO) as s:
                async for t in s.text_stream:
                    seen.append(t)
    assert len(seen) == 2
    assert cast(Any, info.value.body)["error"]["type"] == "serviceUnavailableException"


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer sk-capmon-sim-demo",
        "AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=" + "a" * 64,
        "AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=x-amz-date, Signature="
        + "a" * 64,
        "AWS4-HMAC-SHA256 Credential=k/2026/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=" + "a" * 64,
        "AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=zz",
        "AWS4-HMAC-SHA1 Credential=k/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature="
        + "a" * 64,
    ],
)
def test_sigv4_headers_that_are_not_bedrocks(header: str) -> None:
    assert sigv4.parse(header) is None


def test_a_sigv4_header_read() -> None:
    header = (
        "AWS4-HMAC-SHA256 Credential=sk-capmon-sim-demo/20260101/eu-west-1/bedrock/aws4_request, "
        "SignedHeaders=content-type;host;x-amz-date, Signature=" + "0f" * 32
    )
    assert sigv4.parse(header) == sigv4.Signed(
        "sk-capmon-sim-demo", "20260101", "eu-west-1", "bedrock", ("content-type", "host", "x-amz-date"), "0f" * 32
    )
