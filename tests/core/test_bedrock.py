"""AWS Bedrock's dialect (capmon/core/providers/bedrock_dialect.py): its URLs (the model id
percent-encoded as boto3 encodes it: inference profiles and ARNs work as deployment ids), its
endpoint key ``region``, a Bedrock API key as a bearer, and SigV4 from the standard AWS chain
(aws_sigv4.py), checked for real: a stand-in for Bedrock's runtime on 127.0.0.1 recomputes each
request's signature with botocore's own signer from what it received. Then a FallbackClient end
to end against that stand-in: Converse plain and ConverseStream (an event stream encoded here)
for chat and Messages callers, a tool call, and exceptions inside the stream: before output
they count as the HTTP error they name, after output they end the stream with that error."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from capmon.core.base.exceptions import ConfigError, CredentialsError, RequestFailed
from capmon.core.providers import aws_sigv4
from capmon.core.providers.dialect import DIALECTS
from capmon.core.routing.client import FallbackClient
from capmon.core.routing.targets import Target, build_targets
from capmon.core.types.config import EndpointApi, parse_config, resolve_keys
from capmon.core.types.failure import Kind
from capmon.core.types.result import Format, Request, sent
from tests.support import eventstream as es
from tests.support.scripted import Script, serve, serve_app

pytestmark = pytest.mark.integration

PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-haiku-4-5-20251001-v1:0"
ACCESS, SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
API_KEY = "ABSKQmVkcm9ja0FQSUtleS1leGFtcGxlLWtleS0wMTIzNDU2Nzg5"


def config(endpoint: str, model: str = PROFILE, more: str = "") -> str:
    return f"""
[simulator]
enabled = false
[[endpoints]]
name = "br"
api = "bedrock"
{endpoint}
[[models]]
name = "sonnet"
api_model = "{model}"
endpoints = ["br"]
max_tokens = 100
{more}
"""


def target(endpoint: str, model: str = PROFILE, environ: dict[str, str] | None = None) -> Target:
    cfg = parse_config(config(endpoint, model), "t.toml")
    _, targets = build_targets(cfg, resolve_keys(cfg, environ or {"K": API_KEY}))
    return targets[0]


# ---------------------------------------------------------------- URLs, keys, the config


@pytest.mark.parametrize(
    ("model", "path"),
    [
        (PROFILE, "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0"),
        ("global.anthropic.claude-haiku-4-5-20251001-v1:0", "/model/global.anthropic.claude-haiku-4-5-20251001-v1%3A0"),
        ("meta.llama3-70b-instruct-v1:0", "/model/meta.llama3-70b-instruct-v1%3A0"),
        (
            ARN,
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2F"
            "us.anthropic.claude-haiku-4-5-20251001-v1%3A0",
        ),
    ],
)
def test_the_model_id_is_one_path_segment_encoded_as_boto3_encodes_it(model: str, path: str) -> None:
    t = target('region = "eu-west-3"\nkeys = [{ env = "K" }]', model)
    base = "https://bedrock-runtime.eu-west-3.amazonaws.com"
    assert str(t.url(Format.CONVERSE)) == f"{base}{path}/converse"
    assert str(t.url(Format.CONVERSE, streamed=True)) == f"{base}{path}/converse-stream"
    assert DIALECTS[EndpointApi.BEDROCK].wire_of(Format.MESSAGES, model) is Format.CONVERSE


def test_a_bedrock_api_key_is_a_fixed_bearer_and_no_signature() -> None:
    t = target('region = "us-east-1"\nkeys = [{ env = "K" }]')
    assert dict((k.decode(), v.decode()) for k, v in t.http_headers)["authorization"] == f"Bearer {API_KEY}"
    assert t.auth.sign is None


def test_without_keys_each_request_is_signed() -> None:
    t = target('region = "us-east-1"\nkeys = []', environ={})
    assert t.auth.sign is not None and not t.auth.headers


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        (
            "keys = []",
            r'endpoints\[0\]\.region: missing; expected the AWS region of its Bedrock runtime, such as "us-east-1"',
        ),
        ('region = "us-east5"\nkeys = []', r"expected an AWS region such as \"us-east-1\""),
        ('region = "us-east-1"\nproject = "my-project-123"\nkeys = []', r'project: only for api = "vertex"'),
    ],
)
def test_bedrocks_endpoint_keys_in_the_config(endpoint: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(config(endpoint), "t.toml")


def test_region_on_an_endpoint_of_another_api_names_both_that_take_it() -> None:
    text = config('region = "us-east-1"\nkeys = []').replace(
        'api = "bedrock"', 'api = "openai"\nbase_url = "https://x.test"'
    )
    with pytest.raises(
        ConfigError, match=r'region: only for api = "vertex" or "bedrock" \(this endpoint is api = "openai"\)'
    ):
        parse_config(text, "t.toml")


# ---------------------------------------------------------------- a stand-in for Bedrock's runtime


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    signed: bool | None = None  # the signature recomputed matched (None: none was sent)


ANSWER = {
    "output": {"message": {"role": "assistant", "content": [{"text": "hello"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 5, "outputTokens": 2, "totalTokens": 7},
    "metrics": {"latencyMs": 90},
}


@dataclass
class Bedrock:
    """Bedrock's runtime in us-east-1: ``plain(n, model)`` and ``stream(n, model)`` answer the
    n-th request of each kind (from 1); each request's SigV4 signature is checked."""

    plain: Callable[[int, str], Response] = lambda n, model: JSONResponse(ANSWER)
    stream: Callable[[int, str], list[bytes]] = lambda n, model: es.converse_stream("hello")
    seen: list[Seen] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


_AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(\w+)/(\d{8})/([\w-]+)/bedrock/aws4_request,"
    r" SignedHeaders=([\w;-]+), Signature=([0-9a-f]{64})"
)


def verified(method: str, url: str, headers: dict[str, str], body: bytes) -> bool | None:
    """Whether the request's signature is the one botocore's signer makes from what arrived
    (the signed headers' values, the URL as sent, the body's bytes, the request's own date)
    with the test's credentials; None when it carries none."""
    auth = headers.get("authorization", "")
    match = _AUTH.fullmatch(auth)
    if match is None:
        return None
    access, day, region, names, signature = match.groups()
    if access != ACCESS or region != "us-east-1" or not headers["x-amz-date"].startswith(day):
        return False
    request = AWSRequest(method=method, url=url, data=body, headers={n: headers[n] for n in names.split(";")})
    request.context["timestamp"] = headers["x-amz-date"]
    signer = SigV4Auth(Credentials(ACCESS, SECRET), "bedrock", "us-east-1")
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    # and the body the signature covers is the one sent: its hash is in the canonical request
    assert hashlib.sha256(body).hexdigest() in signer.canonical_request(request)
    return bool(expected == signature)


def bedrock_app(state: Bedrock) -> Starlette:
    async def converse(request: StarletteRequest) -> Response:
        raw = await request.body()
        headers = dict(request.headers)
        raw_path = request.scope["raw_path"].decode()
        url = f"http://{headers['host']}{raw_path}"
        seen = Seen(raw_path, headers, json.loads(raw), verified("POST", url, headers, raw))
        state.seen.append(seen)
        if seen.signed is False:
            body = {"message": "The request signature we calculated does not match the signature you provided."}
            return JSONResponse(body, 403, headers={"x-amzn-ErrorType": "InvalidSignatureException:http://x/"})
        model = request.path_params["model"]
        kind = request.path_params["kind"]
        n = state.counts[kind] = state.counts.get(kind, 0) + 1
        if kind == "converse":
            return state.plain(n, model)
        return Response(b"".join(state.stream(n, model)), media_type="application/vnd.amazon.eventstream")

    return Starlette(routes=[Route("/model/{model}/{kind}", converse, methods=["POST"])])


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[None]:
    """The standard chain sees the test's keys in the environment, and nothing of this machine's."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield


def client_config(url: str, keys: str = "keys = []", more: str = "") -> str:
    return config(f'region = "us-east-1"\nbase_url = "{url}"\n{keys}', more=more)


BACKUP = """
[[models]]
name = "haiku"
api_model = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
endpoints = ["br"]
max_tokens = 100
"""


# ---------------------------------------------------------------- SigV4, for real


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
async def test_sigv4_signs_the_final_url_and_body_with_the_chains_credentials(aws_env: None, transport: str) -> None:
    """On either transport the URL sent is the one signed (aiohttp's yarl would unquote the
    model id's %3A unless told the URL is encoded already)."""
    state = Bedrock()
    async with serve_app(bedrock_app(state)) as url:
        text = client_config(url, more=f'[client]\ntransport = "{transport}"\n')
        async with FallbackClient(parse_config(text, "b.toml"), environ={}) as client:
            result = await client.chat(Request.of("hi there", model="sonnet", max_tokens=20))
            chunks = [c async for c in client.stream_chunks(Request.of("stream it", model="sonnet"))]
            probe = await client.probe(client.targets[0].id)
    assert result.content == "hello" and probe.ok
    assert "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"]) == "hello"
    model = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0"
    assert [s.path for s in state.seen] == [f"{model}/converse", f"{model}/converse-stream", f"{model}/converse"]
    assert [s.signed for s in state.seen] == [True, True, True]
    assert state.seen[0].body == {
        "messages": [{"role": "user", "content": [{"text": "hi there"}]}],
        "inferenceConfig": {"maxTokens": 20},
    }
    assert state.seen[2].body == {
        "messages": [{"role": "user", "content": [{"text": "ping"}]}],
        "inferenceConfig": {"maxTokens": 1},
    }


async def test_a_signature_over_other_bytes_is_refused_by_the_check() -> None:
    """The stand-in's check can fail: a body changed after signing does not verify."""
    request = httpx.Request(
        "POST",
        "http://127.0.0.1:1/model/m%3A0/converse",
        content=b'{"a": 1}',
        headers={"content-type": "application/json"},
    )
    signer = aws_sigv4.Signer("us-east-1", "test", lambda: Credentials(ACCESS, SECRET))
    await signer.sign(request)
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert verified("POST", str(request.url), headers, b'{"a": 1}') is True
    assert verified("POST", str(request.url), headers, b'{"a": 2}') is False
    assert verified("POST", "http://127.0.0.1:1/model/m%3A1/converse", headers, b'{"a": 1}') is False


async def test_temporary_credentials_sign_with_their_session_token() -> None:
    token = "IQoJb3JpZ2luX2VjEXAMPLESESSIONTOKEN0123456789"
    request = httpx.Request(
        "POST", "https://bedrock-runtime.us-east-1.amazonaws.com/model/m%3A0/converse", content=b"{}"
    )
    signer = aws_sigv4.Signer("us-east-1", "test", lambda: Credentials(ACCESS, SECRET, token))
    await signer.sign(request)
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert headers["x-amz-security-token"] == token and "x-amz-security-token" in headers["authorization"]
    assert verified("POST", str(request.url), headers, b"{}") is True


async def test_temporary_credentials_are_refreshed_before_they_expire_and_kept_while_fresh() -> None:
    from datetime import datetime, timedelta

    from botocore.credentials import RefreshableCredentials

    refreshes: list[int] = []

    def metadata(minutes: int) -> dict[str, str]:
        n = len(refreshes)
        expiry = (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()
        return {"access_key": ACCESS, "secret_key": SECRET, "token": f"token-{n}", "expiry_time": expiry}

    def refresh() -> dict[str, str]:
        refreshes.append(1)
        return metadata(60)

    def load() -> RefreshableCredentials:  # the chain's role credentials, 5 minutes from expiring
        return RefreshableCredentials.create_from_metadata(metadata(5), refresh, "assume-role")

    signer = aws_sigv4.Signer("us-east-1", "test", load)
    tokens = []
    for _ in range(3):
        request = httpx.Request("POST", "https://x.test/model/m/converse", content=b"{}")
        await signer.sign(request)
        tokens.append(request.headers["x-amz-security-token"])
    assert tokens == ["token-1", "token-1", "token-1"] and len(refreshes) == 1  # refreshed once, early


async def test_no_credentials_in_the_chain_is_a_credentials_error_naming_the_endpoint() -> None:
    signer = aws_sigv4.Signer("us-east-1", 'endpoint "br" (api = "bedrock", keys = [])', lambda: None)
    with pytest.raises(
        CredentialsError, match=r'endpoint "br" \(api = "bedrock", keys = \[\]\): no AWS credentials found'
    ):
        await signer.sign(httpx.Request("POST", "https://x.test/model/m/converse", content=b"{}"))


async def test_the_secret_key_never_reaches_an_error_or_the_log(
    aws_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Credentials:
        raise RuntimeError(f"could not read {SECRET} from somewhere")

    signer = aws_sigv4.Signer("us-east-1", 'endpoint "br"', broken)
    ok = aws_sigv4.Signer("us-east-1", 'endpoint "br"', lambda: Credentials(ACCESS, SECRET))
    await ok.sign(httpx.Request("POST", "https://x.test/model/m/converse", content=b"{}"))  # held as a secret now
    with caplog.at_level(logging.DEBUG), pytest.raises(CredentialsError) as e:
        await signer.sign(httpx.Request("POST", "https://x.test/model/m/converse", content=b"{}"))
    assert SECRET not in str(e.value) and "RuntimeError" in str(e.value) and SECRET not in caplog.text


async def test_a_bedrock_api_key_is_sent_as_a_bearer(aws_env: None) -> None:
    state = Bedrock()
    async with serve_app(bedrock_app(state)) as url:
        text = client_config(url, 'keys = [{ env = "AWS_BEARER_TOKEN_BEDROCK" }]')
        async with FallbackClient(
            parse_config(text, "b.toml"), environ={"AWS_BEARER_TOKEN_BEDROCK": API_KEY}
        ) as client:
            assert (await client.chat(Request.of("hi", model="sonnet"))).content == "hello"
    assert state.seen[0].headers["authorization"] == f"Bearer {API_KEY}" and state.seen[0].signed is None


# ---------------------------------------------------------------- end to end


def _exception_first(kind: str, message: str) -> Callable[[int, str], list[bytes]]:
    """sonnet's first stream is an exception before any output (an error message of the
    stream, ``:message-type: error``, for a name in AWS's PascalCase); every other stream answers."""
    failed = es.error(kind, message) if kind[0].isupper() else es.exception(kind, message)

    def stream(n: int, model: str) -> list[bytes]:
        if "sonnet" in model and n == 1:
            return [es.event("messageStart", {"role": "assistant"}), failed]
        return es.converse_stream("from " + model.split(".")[2][:12])

    return stream


async def test_a_messages_caller_is_answered_in_messages_plain_streamed_and_with_a_tool(aws_env: None) -> None:
    state = Bedrock(stream=lambda n, model: es.tool_stream() if n == 2 else es.converse_stream("hello"))
    weather = {"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    async with serve_app(bedrock_app(state)) as url:
        async with FallbackClient(parse_config(client_config(url), "b.toml"), environ={}) as client:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "system": "Be brief."}
            plain = await client.chat(Request.anthropic(body))
            events = [e async for e in client.stream_chunks(Request.anthropic(body))]
            tools = [e async for e in client.stream_chunks(Request.anthropic({**body, "tools": [weather]}))]
    assert plain.response is not None and plain.response["content"] == [{"type": "text", "text": "hello"}]
    assert [e["type"] for e in events][-2:] == ["message_delta", "message_stop"]
    assert events[-2]["delta"]["stop_reason"] == "end_turn" and events[-2]["usage"]["output_tokens"] == 3
    use = next(e for e in tools if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use")
    assert use["content_block"]["id"] == "tooluse_1" and use["content_block"]["name"] == "weather"
    said = "".join(e["delta"].get("partial_json", "") for e in tools if e["type"] == "content_block_delta")
    assert json.loads(said) == {"city": "Paris"}
    assert state.seen[0].body["system"] == [{"text": "Be brief."}]
    assert state.seen[2].body["toolConfig"]["tools"][0]["toolSpec"]["name"] == "weather"


@pytest.mark.parametrize(
    ("exception", "message", "kind"),
    [
        ("throttlingException", "Too many tokens, please wait before trying again.", Kind.RATE_LIMITED),
        ("serviceUnavailableException", "Bedrock is unable to process your request.", Kind.CAPACITY),
        ("internalServerException", "The system encountered an unexpected error during processing.", Kind.TRANSIENT),
        ("modelStreamErrorException", "The model stream failed.", Kind.TRANSIENT),
        # :message-type: error, :error-code as AWS names it
        ("ThrottlingException", "Too many requests, please wait before trying again.", Kind.RATE_LIMITED),
        ("ServiceUnavailableException", "Bedrock is unable to process your request.", Kind.CAPACITY),
    ],
)
async def test_an_exception_in_the_stream_before_output_counts_as_the_http_error_it_names(
    aws_env: None, exception: str, message: str, kind: Kind
) -> None:
    state = Bedrock(stream=_exception_first(exception, message))
    async with serve_app(bedrock_app(state)) as url:
        cfg = parse_config(client_config(url, more=BACKUP), "b.toml")
        async with FallbackClient(cfg, environ={}) as client:
            stream = client.stream_chunks(Request.of("hi", model="sonnet"))
            chunks = [c async for c in stream]
    attempts = sent(stream.attempts)
    assert attempts[0].kind is kind  # by its type: the 400 a decoder gives every exception frame says nothing
    assert exception[0].upper() + exception[1:] in (attempts[0].reason or "")
    said = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
    assert said.startswith("from ") and stream.result is not None  # served whole, by a retry or the next model


async def test_an_exception_after_output_ends_the_stream_with_that_error(aws_env: None) -> None:
    def stream(n: int, model: str) -> list[bytes]:
        return [
            *es.converse_stream("Hello there")[:2],
            es.exception("throttlingException", "Too many tokens, please wait before trying again."),
        ]

    state = Bedrock(stream=stream)
    async with serve_app(bedrock_app(state)) as url:
        async with FallbackClient(parse_config(client_config(url), "b.toml"), environ={}) as client:
            got: list[Any] = []
            with pytest.raises(RequestFailed) as broken:
                async for c in client.stream_chunks(Request.of("hi", model="sonnet", continuation=False)):
                    got.append(c)
    assert got and broken.value.failure.kind is Kind.RATE_LIMITED
    assert "ThrottlingException" in broken.value.failure.reason


async def test_a_corrupted_frame_is_a_broken_stream_never_data(aws_env: None) -> None:
    def stream(n: int, model: str) -> list[bytes]:
        whole = es.converse_stream("Hello there")
        bad = bytearray(whole[2])
        bad[-2] ^= 0x40
        return [*whole[:2], bytes(bad), *whole[3:]] if n == 1 else whole

    state = Bedrock(stream=stream)
    async with serve_app(bedrock_app(state)) as url:
        async with FallbackClient(parse_config(client_config(url), "b.toml"), environ={}) as client:
            got: list[Any] = []
            with pytest.raises(RequestFailed) as broken:
                async for c in client.stream_chunks(Request.of("hi", model="sonnet", continuation=False)):
                    got.append(c)
    assert broken.value.failure.kind is Kind.TRANSIENT and "broken event stream" in broken.value.failure.reason
    said = "".join((c["choices"][0]["delta"].get("content") or "") for c in got if c["choices"])
    assert said == "Hello "  # the first piece only: the corrupted one never reached the caller


async def test_an_on_demand_id_that_needs_a_profile_parks_its_target_and_says_what_to_configure(aws_env: None) -> None:
    message = (
        "Invocation of model ID anthropic.claude-sonnet-4-5-20250929-v1:0 with on-demand throughput isn't supported."
        " Retry your request with the ID or ARN of an inference profile that contains this model."
    )

    def plain(n: int, model: str) -> Response:
        if model.startswith("anthropic."):
            return JSONResponse(
                {"message": message}, 400, headers={"x-amzn-ErrorType": "ValidationException:http://x/"}
            )
        return JSONResponse(ANSWER)

    state = Bedrock(plain=plain)
    async with serve_app(bedrock_app(state)) as url:
        text = config(
            f'region = "us-east-1"\nbase_url = "{url}"\nkeys = []',
            model="anthropic.claude-sonnet-4-5-20250929-v1:0",
            more=BACKUP,
        )
        async with FallbackClient(parse_config(text, "b.toml"), environ={}) as client:
            result = await client.chat(Request.of("hi", model="sonnet"))
    first = sent(result.attempts)[0]
    assert result.model == "haiku" and first.kind is Kind.BAD_REQUEST
    assert "inference profile" in (first.reason or "") and '"us.<model id>"' in (first.reason or "")


async def test_a_converse_caller_is_served_untouched_by_bedrock_and_translated_by_a_chat_server(aws_env: None) -> None:
    """A request in Converse's own format: to Bedrock its body passes as it is (but the cap)
    and its events come back as they were sent; to an OpenAI-wire model it is translated, and
    the answer and the stream come back as Converse's."""
    state = Bedrock()
    body = {"messages": [{"role": "user", "content": [{"text": "hi"}]}], "additionalModelRequestFields": {"top_k": 5}}
    async with serve_app(bedrock_app(state)) as url, serve(Script()) as chat_url:
        text = (
            client_config(url)
            + f"""
[[endpoints]]
name = "chat"
base_url = "{chat_url}"
keys = []
[[models]]
name = "gpt"
endpoints = ["chat"]
max_tokens = 50
"""
        )
        async with FallbackClient(parse_config(text, "b.toml"), environ={}) as client:
            own = await client.chat(Request.of_body(Format.CONVERSE, body, model="sonnet"))
            events = [e async for e in client.stream_chunks(Request.of_body(Format.CONVERSE, body, model="sonnet"))]
            plain = {"messages": body["messages"]}
            crossed = await client.chat(Request.of_body(Format.CONVERSE, plain, model="gpt"))
            streamed = [e async for e in client.stream_chunks(Request.of_body(Format.CONVERSE, plain, model="gpt"))]
    assert own.content == "hello" and own.response is not None and own.response["stopReason"] == "end_turn"
    assert state.seen[0].body == {**body, "inferenceConfig": {"maxTokens": 100}}
    assert [next(iter(e)) for e in events][-2:] == ["messageStop", "metadata"]
    assert crossed.content == "hello" and crossed.response is not None
    assert crossed.response["output"]["message"]["content"] == [{"text": "hello"}]
    assert [next(iter(e)) for e in streamed][0] == "messageStart" and "metadata" in streamed[-1]
