"""Vertex AI without keys: Google OAuth tokens from a service account's key file
(capmon/core/providers/google_token.py), over real HTTP. The key file is made here with a
new RSA key and a ``token_uri`` at a token server on 127.0.0.1, so google-auth itself signs
the JWT grant and reads the answer; the server checks the signature. Tokens are refreshed
before they expire, one refresh at a time, never shown in an error or a log; and a
FallbackClient's requests to Claude on Vertex (a stand-in for Vertex's ``rawPredict`` and
``streamRawPredict``) carry them, at the plain and the streamed URL, in Vertex's body."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import jwt
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from capmon.core.base.exceptions import CredentialsError
from capmon.core.providers import google_token
from capmon.core.providers.classify import classify_exception
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import parse_config
from capmon.core.types.failure import Kind
from capmon.core.types.result import Request
from tests.support.scripted import serve_app

pytestmark = pytest.mark.integration

PROJECT = "my-project-123"
EMAIL = f"capmon-test@{PROJECT}.iam.gserviceaccount.com"
CLAUDE = "claude-haiku-4-5@20251001"
AUDIENCE = "https://oauth2.googleapis.com/token"  # a grant's audience, whatever the token_uri


# ---------------------------------------------------------------- a token server and a key file


@dataclass
class TokenServer:
    """Google's OAuth token endpoint, for the JWT grant: ``answer(n)`` gives the n-th
    answer's status and body (from 1); every grant's assertion is checked against the key."""

    answer: Callable[[int], tuple[int, dict[str, Any]]]
    public_pem: bytes
    delay: float = 0.0  # seconds each answer takes (a refresh others wait for)
    grants: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


def token(n: int, expires_in: int = 3600) -> tuple[int, dict[str, Any]]:
    return 200, {
        "access_token": f"ya29.c.token-number-{n}-0123456789",
        "expires_in": expires_in,
        "token_type": "Bearer",
    }


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def token_server(rsa_key: rsa.RSAPrivateKey) -> Iterator[Callable[..., TokenServer]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[int], tuple[int, dict[str, Any]]], delay: float = 0.0) -> TokenServer:
        pem = rsa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1)
        state = TokenServer(answer, pem, delay)
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["content-length"])).decode())
                assert form["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
                claims = jwt.decode(form["assertion"][0], certs={"k1": state.public_pem}, audience=AUDIENCE)
                with lock:
                    state.grants.append(claims)
                    n = len(state.grants)
                time.sleep(state.delay)
                status, body = state.answer(n)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        state.url = f"http://127.0.0.1:{server.server_address[1]}/token"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def key_file(path: Path, key: rsa.RSAPrivateKey, token_uri: str) -> Path:
    """A service account's JSON key file, as the Cloud console gives one, but its token_uri."""
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    info = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": EMAIL,
        "client_id": "1234567890",
        "token_uri": token_uri,
    }
    path.write_text(json.dumps(info))
    return path


def source(path: Path) -> google_token.TokenSource:
    return google_token.TokenSource(functools.partial(google_token.load, str(path)), 'endpoint "vx"')


async def signed(s: google_token.TokenSource) -> str:
    request = httpx.Request("POST", "https://aiplatform.googleapis.com/v1/x", content=b"{}")
    await s.sign(request)
    return request.headers["authorization"]


# ---------------------------------------------------------------- tokens


async def test_a_token_is_refreshed_before_it_expires_and_kept_while_fresh(
    token_server: Callable[..., TokenServer], rsa_key: rsa.RSAPrivateKey, tmp_path: Path
) -> None:
    # The first token expires in 2 minutes: inside google-auth's margin, so stale at once.
    server = token_server(lambda n: token(n, 120 if n == 1 else 3600))
    s = source(key_file(tmp_path / "sa.json", rsa_key, server.url))
    assert await signed(s) == "Bearer ya29.c.token-number-1-0123456789"
    assert await signed(s) == "Bearer ya29.c.token-number-2-0123456789"  # refreshed before its expiry
    assert await signed(s) == "Bearer ya29.c.token-number-2-0123456789"  # fresh: no refresh
    assert len(server.grants) == 2
    grant = server.grants[0]
    assert grant["iss"] == EMAIL and grant["scope"] == "https://www.googleapis.com/auth/cloud-platform"


async def test_requests_that_come_during_a_refresh_wait_for_it(
    token_server: Callable[..., TokenServer], rsa_key: rsa.RSAPrivateKey, tmp_path: Path
) -> None:
    server = token_server(token, delay=0.3)
    s = source(key_file(tmp_path / "sa.json", rsa_key, server.url))
    headers = await asyncio.gather(*(signed(s) for _ in range(8)))
    assert set(headers) == {"Bearer ya29.c.token-number-1-0123456789"} and len(server.grants) == 1


async def test_a_failed_refresh_says_why_without_any_token(
    token_server: Callable[..., TokenServer],
    rsa_key: rsa.RSAPrivateKey,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = "ya29.c.token-number-1-0123456789"

    def answer(n: int) -> tuple[int, dict[str, Any]]:
        if n == 1:
            return token(n, 60)  # stale at once: the next request refreshes
        return 400, {"error": "invalid_grant", "error_description": f"token {first} was revoked"}

    server = token_server(answer)
    s = source(key_file(tmp_path / "sa.json", rsa_key, server.url))
    assert await signed(s) == f"Bearer {first}"
    with caplog.at_level(logging.DEBUG), pytest.raises(CredentialsError) as e:
        await signed(s)
    text = str(e.value)
    assert text.startswith('endpoint "vx": no Google access token (RefreshError: ') and "invalid_grant" in text
    assert first not in text and e.value.__cause__ is None and e.value.__suppress_context__
    assert first not in caplog.text
    failure = classify_exception(e.value)  # what the attempt records: it falls back as from an unreachable endpoint
    assert failure.kind is Kind.TRANSIENT and failure.reason.startswith("no credentials (CredentialsError: endpoint")
    assert first not in failure.reason


async def test_missing_credentials_are_a_credentials_error(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match='endpoint "vx": no Google access token .*sa.json'):
        await signed(source(tmp_path / "sa.json"))


# ---------------------------------------------------------------- Claude on Vertex, end to end


@dataclass
class Seen:
    path: str
    authorization: str
    body: dict[str, Any]


def vertex_stand_in(seen: list[Seen]) -> Starlette:
    """Vertex's Anthropic publisher models: a Messages answer at ``:rawPredict``, its stream
    at ``:streamRawPredict``; what each request was, recorded."""

    async def predict(request: StarletteRequest) -> Response:
        body = json.loads(await request.body())
        seen.append(Seen(request.url.path, request.headers.get("authorization", ""), body))
        name, _, method = request.path_params["action"].partition(":")
        usage = {"input_tokens": 5, "output_tokens": 2}
        if method == "rawPredict":
            return JSONResponse(
                {
                    "id": "msg_vrtx_1",
                    "type": "message",
                    "role": "assistant",
                    "model": name,
                    "content": [{"type": "text", "text": "hello"}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": usage,
                }
            )
        assert method == "streamRawPredict", method
        message = {"id": "msg_vrtx_2", "type": "message", "role": "assistant", "model": name, "content": []}
        events = [
            ("message_start", {"message": {**message, "stop_reason": None, "usage": {**usage, "output_tokens": 0}}}),
            ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "hel"}}),
            ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
            ("content_block_stop", {"index": 0}),
            ("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": usage}),
            ("message_stop", {}),
        ]
        sse = "".join(f"event: {e}\ndata: {json.dumps({'type': e, **d})}\n\n" for e, d in events)
        return Response(sse, media_type="text/event-stream")

    path = "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{action}"
    return Starlette(routes=[Route(path, predict, methods=["POST"])])


async def test_claude_on_vertex_is_asked_with_a_refreshed_token_at_its_plain_and_streamed_urls(
    token_server: Callable[..., TokenServer], rsa_key: rsa.RSAPrivateKey, tmp_path: Path
) -> None:
    server = token_server(token)
    sa = key_file(tmp_path / "sa.json", rsa_key, server.url)
    seen: list[Seen] = []
    async with serve_app(vertex_stand_in(seen)) as url:
        text = f"""
[simulator]
enabled = false
[[endpoints]]
name = "vx"
api = "vertex"
base_url = "{url}"
project = "{PROJECT}"
region = "us-east5"
credentials_file = "{sa}"
keys = []
[[models]]
name = "haiku"
api_model = "{CLAUDE}"
endpoints = ["vx"]
max_tokens = 64
"""
        request = Request.anthropic({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20})
        async with FallbackClient(parse_config(text, "vertex.toml"), environ={}) as client:
            result = await client.chat(request)
            chunks = [c async for c in client.stream_chunks(request)]
            probe = await client.probe(client.targets[0].id)
    assert result.content == "hello" and result.model == "haiku"
    assert any(c.get("type") == "message_stop" for c in chunks)
    models = f"/v1/projects/{PROJECT}/locations/us-east5/publishers/anthropic/models/{CLAUDE}"
    assert probe.ok
    assert [s.path for s in seen] == [f"{models}:rawPredict", f"{models}:streamRawPredict", f"{models}:rawPredict"]
    assert {s.authorization for s in seen} == {"Bearer ya29.c.token-number-1-0123456789"}
    assert len(server.grants) == 1  # one token for every request
    for s in seen:
        assert s.body["anthropic_version"] == "vertex-2023-10-16" and "model" not in s.body
    assert seen[1].body["stream"] is True and "stream" not in seen[0].body
    assert seen[2].body == {
        "anthropic_version": "vertex-2023-10-16",
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
    }
