"""A recognisable key through every failure kind, with servers that echo it back, then a
search of everything capmon produces: log records (every logger, DEBUG), events on the
bus, exceptions (message, repr, traceback), attempts seen by an observer (the audit log's
hook), results, snapshots as JSON, and `capmon status --json`. The key appears nowhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import httpx
import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from tests.support.configs import three_models, write_config
from tests.support.scripted import Reply, Script, ok, serve

KEY = "sk-SECRET-canary-1234567890"
# An Azure-style key: 32 hex digits, which no pattern can tell from a request id; only
# knowing the keys it holds lets capmon find it.
HEX_KEY = "f3a9c2e1d4b5a69788776655443322aa"
ENV = {"CANARY_KEY": KEY}
KEYS = '[{ env = "CANARY_KEY", alias = "canary" }]'


def needles(key: str) -> tuple[str, ...]:
    """The key, and pieces of it long enough to matter."""
    return (key, key[3:], key[:12], key[-12:], key[8:20])


NEEDLES = needles(KEY)


def _openai(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, {"error": {"message": message, "type": "invalid_request_error", "code": code}}, headers or {})


def echoes(key: str) -> dict[str, Reply]:
    """Each failure kind, worded as a provider that echoes what it was sent."""
    return {
        "auth": _openai(
            401,
            f"Incorrect API key provided: {key}. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "invalid_api_key",
        ),
        "auth-html": Reply(403, f"<html><head><title>403 Forbidden: {key}</title></head><body>key {key}</body></html>"),
        "rate_limited": _openai(
            429,
            f"Rate limit reached for key {key} on requests per min (RPM). Please try again in 1s.",
            "rate_limit_exceeded",
            {"retry-after": "1", "x-echo-authorization": f"Bearer {key}"},
        ),
        "quota": _openai(
            429,
            f"You exceeded your current quota for {key}, please check your plan and billing details.",
            "insufficient_quota",
        ),
        "capacity": _openai(
            503,
            f"Selected model is at capacity for Bearer {key}. Please try a different model.",
            "server_is_overloaded",
        ),
        "too_large": _openai(
            400, f"This model's maximum context length is 10 tokens (key={key}).", "context_length_exceeded"
        ),
        "bad_request": _openai(400, f"Invalid header value 'Authorization: Bearer {key}'", "invalid_value"),
        "transient": Reply(502, f"Bad gateway while forwarding Authorization: Bearer {key} upstream"),
        "broken-200": Reply(200, f"upstream said: {key}"),
        "error-200": Reply(200, {"error": f"wrapped failure for {key}"}),
    }


ECHOES = echoes(KEY)


class Collected:
    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []
        self.needles: tuple[str, ...] = NEEDLES

    def add(self, where: str, obj: Any) -> None:
        self.texts.append((where, obj if isinstance(obj, str) else repr(obj)))

    def add_exception(self, where: str, e: BaseException) -> None:
        self.add(where + " str", str(e))
        self.add(where + " repr", repr(e))
        self.add(where + " traceback", "".join(traceback.format_exception(e)))
        if isinstance(e, RequestFailed):
            self.add(where + " failure", e.failure)
            self.add(where + " attempts", e.attempts)

    def check(self) -> None:
        leaks = [
            (where, text[max(0, text.find(n) - 60) : text.find(n) + 40])
            for where, text in self.texts
            for n in self.needles
            if n in text
        ]
        assert not leaks, f"the key leaked in {len(leaks)} place(s): {sorted({w for w, _ in leaks})}, e.g. {leaks[:3]}"


@pytest.fixture
def collected(caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.DEBUG)  # the root logger: every logger that propagates
    for name in ("capmon", "httpx", "httpcore", "uvicorn", "uvicorn.error", "asyncio"):
        caplog.set_level(logging.DEBUG, logger=name)  # restored after the test, as the root's is
    c = Collected()
    yield c
    records = caplog.get_records("setup") + caplog.get_records("call")
    for record in records:
        c.add(f"log {record.name}", record.getMessage())
        c.add(f"log {record.name} args", record.args)
        if record.exc_info:
            c.add(f"log {record.name} exc", "".join(traceback.format_exception(*record.exc_info)))
    assert records, "nothing was logged: the capture is not working"
    c.check()


def _wire(client: FallbackClient, c: Collected) -> list[ev.Event]:
    events: list[ev.Event] = []
    client.bus.subscribe(events.append)

    def broken_subscriber(event: ev.Event) -> None:  # its failure is logged with the event
        raise RuntimeError(f"subscriber failed on {event!r}")

    def broken_observer(request: Any, attempt: Any) -> None:  # and so is this one's
        raise RuntimeError(f"observer failed on {attempt!r}")

    client.bus.subscribe(broken_subscriber)
    client.add_observer(lambda request, attempt: c.add("observer", (request, attempt)))
    client.add_observer(broken_observer)
    return events


@pytest.mark.looptime
@pytest.mark.parametrize("key", [KEY, HEX_KEY], ids=["sk-key", "hex-key"])
async def test_an_echoed_key_reaches_no_log_event_exception_or_snapshot(collected: Collected, key: str) -> None:
    collected.needles = needles(key)
    script = Script()
    replies = echoes(key)
    async with serve(script) as url:
        cfg = three_models(url, keys=KEYS, extra="[client]\nmax_attempts = 3\ndeadline = 60.0")
        async with FallbackClient(cfg, environ={"CANARY_KEY": key}) as client:
            events = _wire(client, collected)
            collected.add("targets", client.targets)
            collected.add("config", client.config)
            for kind, reply in replies.items():
                # the flagship answers with the echo; the others answer normally, or echo too
                for model in ("flagship", "medium", "small"):
                    script.always(model, reply if model == "flagship" or kind.startswith("auth") else ok(model))
                try:
                    result = await client.chat(f"request for {kind}")
                    collected.add(f"{kind} result", result)
                except RequestFailed as e:
                    collected.add_exception(kind, e)
                # streaming too: an echo before any text
                try:
                    collected.add(f"{kind} stream", [p async for p in client.stream(f"stream for {kind}")])
                except RequestFailed as e:
                    collected.add_exception(kind + " stream", e)
                snap = client.snapshot()
                collected.add(f"{kind} snapshot", json.dumps(snap.to_dict(), default=str))
                for t in snap.targets:
                    collected.add(f"{kind} key reason", t.key_reason)
                for m in client.model_names():
                    client.reset(m)  # un-park and re-enable the key for the next kind
            collected.add("probe", [await client.probe(t.id) for t in client.targets])
            collected.add("events", events)
            collected.add("recent", client.bus.recent())
    # every failure kind really happened
    kinds = {e.kind for e in events if isinstance(e, ev.AttemptFailed)}
    assert kinds >= {"auth", "rate_limited", "quota", "capacity", "too_large", "bad_request", "transient"}, kinds
    assert any(isinstance(e, ev.KeyParked) for e in events)
    assert {s.key for s in script.seen} == {key}  # the key was sent, and only in its header


@pytest.mark.looptime
async def test_an_exception_that_carries_the_key_is_not_repeated(collected: Collected) -> None:
    # A transport error whose own text names the key (a proxy echoing the header, say).
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == f"Bearer {KEY}"  # the key is sent, only sent
        raise httpx.ConnectError(f"proxy refused {request.url} with headers {dict(request.headers)!r}", request=request)

    cfg = three_models("http://upstream.invalid/v1", keys=KEYS, extra="[client]\nmax_attempts = 4")
    async with FallbackClient(cfg, environ=ENV, transport=httpx.MockTransport(handler)) as client:
        events = _wire(client, collected)
        with pytest.raises(RequestFailed) as info:
            await client.chat("hi")
        collected.add_exception("connect", info.value)
        collected.add("events", events)
        collected.add("snapshot", json.dumps(client.snapshot().to_dict(), default=str))
    assert "is unreachable: connection failed (ConnectError: proxy refused" in info.value.failure.reason


def _status_config(tmp_path: Path, url: str) -> Path:
    return write_config(tmp_path / "config.toml", url, keys=KEYS, models=["flagship", "medium"])


async def test_capmon_status_json_shows_no_key(tmp_path: Path) -> None:
    script = Script()
    script.always("flagship", ECHOES["auth"])
    script.always("medium", ECHOES["capacity"])
    async with serve(script) as url:
        cfg = _status_config(tmp_path, url)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "capmon.cli",
            "status",
            "--once",
            "--json",
            "--probe",
            "--config",
            str(cfg),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **ENV},
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    snap = json.loads(out)
    assert [t["last_status"] for t in snap["targets"]] == [401, 503]  # the probes reached the echoing server
    assert [s.key for s in script.seen] == [KEY, KEY]  # and sent the key
    for n in NEEDLES:
        assert n not in out.decode() and n not in err.decode()
