"""The access log (issue 18, item 2): one JSON line per request, every field there, never
a key or prompt text, and a log that cannot be written never fails a request."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import logging
import os
import random
import re
import time
from pathlib import Path

import openai
import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.gateway.access_log import CLOSE_TIMEOUT, AccessLog
from capmon.gateway.exchange import log_time
from tests.gateway.helpers import HELLO, running

pytestmark = pytest.mark.looptime

CLIENT = "sk-gw-client-canary-9e8d7c6b5a41"
PROMPT = "PROMPT-CANARY-31415 tell me about capacity"
KEYS = 'keys = [{ env = "GW_CLIENT", alias = "team" }]'
FIELDS = {
    "time",
    "request_id",
    "caller",
    "method",
    "path",
    "model_requested",
    "model_served",
    "endpoint",
    "deployment",
    "api",
    "served_api",
    "attempts",
    "fallbacks",
    "status",
    "error_kind",
    "priority",
    "latency_ms",
    "ttfb_ms",
    "tokens_in",
    "tokens_out",
    "tokens_cached",
    "cost_usd",
    "skipped",
    "continued",
}


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_one_line_per_request_with_every_field_and_no_key_or_prompt(tmp_path: Path) -> None:
    where = tmp_path / "access.jsonl"
    gateway = f'{KEYS}\naccess_log = "{where}"'
    async with running(gateway=gateway, environ={"GW_CLIENT": CLIENT}) as gw, gw.openai(CLIENT) as sdk:
        gw.client.trip("flagship")
        plain = await sdk.chat.completions.with_raw_response.create(
            model="flagship", messages=[{"role": "user", "content": PROMPT}]
        )
        async for _ in await sdk.responses.create(model="auto", input=PROMPT, stream=True):
            pass
        with pytest.raises(openai.NotFoundError):
            await sdk.chat.completions.create(model=CLIENT, messages=[{"role": "user", "content": PROMPT}])
        with pytest.raises(openai.AuthenticationError):
            await gw.openai("sk-wrong-key-000000000000").models.list()
    text = where.read_text()
    assert CLIENT not in text and "PROMPT-CANARY" not in text
    lines = _lines(where)
    assert len(lines) == 4 and all(set(line) == FIELDS for line in lines)
    chat, stream, missing, refused = lines
    assert chat["request_id"] == plain.headers["x-request-id"]
    assert chat["caller"] == "team" and chat["method"] == "POST" and chat["path"] == "/v1/chat/completions"
    assert (chat["model_requested"], chat["model_served"], chat["endpoint"], chat["api"]) == (
        "flagship",
        "medium",
        "sim",
        "chat",
    )
    assert (chat["attempts"], chat["fallbacks"], chat["status"], chat["error_kind"]) == (1, 1, 200, None)
    assert chat["priority"] == "interactive" and chat["served_api"] == "openai"
    assert chat["deployment"] == "sim-medium"  # the id the endpoint knows medium by (its api_model)
    assert isinstance(chat["tokens_in"], int) and chat["tokens_in"] > 0 and chat["tokens_out"] == 12
    assert chat["tokens_cached"] == 0 and chat["cost_usd"] is None  # the test config prices no model
    assert isinstance(chat["latency_ms"], float) and isinstance(chat["ttfb_ms"], float)
    assert str(chat["time"]).endswith("Z")
    assert (stream["api"], stream["model_requested"], stream["model_served"], stream["status"]) == (
        "responses",
        "auto",
        "medium",
        200,
    )
    assert stream["fallbacks"] == 1 and stream["tokens_out"] == 12  # auto's first choice, flagship, is tripped
    # ... and each says it passed flagship over, and why
    for line in (chat, stream):
        assert [(s["target"], s["why"]) for s in line["skipped"]] == [("flagship@sim/sim-key", "tripped")]
        assert line["skipped"][0]["reason"].startswith("tripped: tripped by hand")
    assert missing["skipped"] == [] and refused["skipped"] == []
    assert (missing["status"], missing["error_kind"], missing["model_requested"]) == (
        404,
        "model_not_found",
        "[redacted]",
    )
    assert (refused["status"], refused["caller"], refused["path"]) == (401, None, "/v1/models")


async def test_a_log_that_cannot_be_written_never_fails_a_request(caplog: pytest.LogCaptureFixture) -> None:
    # /dev/full: every write fails as on a full disk
    with caplog.at_level(logging.WARNING, "capmon.gateway"):
        async with running(gateway='access_log = "/dev/full"') as gw, gw.openai() as sdk, gw.http() as http:
            answers = [await sdk.chat.completions.create(model="auto", messages=HELLO) for _ in range(3)]
            log = gw.app.state.gateway.access_log
            reads, counted = 0, 0.0
            while reads < 200 and counted < 3:  # the writer thread drops them a moment after the replies
                metrics = (await http.get("/metrics")).text
                reads += 1
                found = re.search(r"^capmon_access_log_dropped_total (\S+)$", metrics, re.M)
                counted = float(found.group(1)) if found else 0.0
                await asyncio.sleep(0.01)
            assert counted >= 3  # an operator sees them (the /metrics reads' own lines may be counted too)
    assert all(a.choices[0].message.content for a in answers)
    assert log is not None and log.dropped == 3 + reads and log.written == 0  # the /metrics reads' lines too
    said = [r.getMessage() for r in caplog.records if "access log" in r.getMessage()]
    assert len(said) == 2 and "No space left" in said[0] and f"{3 + reads} line(s) dropped" in said[1]


def test_dev_full_and_a_closed_pipe_drop_lines_and_count_them() -> None:
    full = AccessLog("/dev/full")
    for i in range(5):
        full.write({"n": i})
    full.close()
    assert full.dropped == 5 and full.written == 0
    r, w = os.pipe()
    os.close(r)
    piped = AccessLog("pipe", stream=os.fdopen(w, "w"))
    piped.write({"n": 1})
    piped.close()
    assert piped.dropped == 1


def test_a_full_queue_drops_rather_than_waits() -> None:
    out = io.StringIO()
    log = AccessLog("mem", capacity=1, stream=out)
    for i in range(2000):
        log.write({"n": i})
    log.close()
    assert log.written + log.dropped == 2000 and log.written >= 1


async def test_a_refusal_is_logged_as_what_it_was_refused_for(tmp_path: Path) -> None:
    where = tmp_path / "access.jsonl"
    async with running(gateway=f'access_log = "{where}"') as gw, gw.openai() as sdk:
        for m in ("flagship", "medium", "small"):
            gw.client.trip(m)
        with pytest.raises(openai.APIStatusError) as info:
            await sdk.chat.completions.create(model="auto", messages=HELLO)
    assert info.value.response.status_code == 503
    (line,) = _lines(where)
    # not "capacity": nothing failed for capacity, every model was tripped by hand
    assert (line["status"], line["error_kind"], line["attempts"]) == (503, "models_unavailable", 0)
    assert [(s["target"].split("@")[0], s["why"]) for s in line["skipped"]] == [
        ("flagship", "tripped"),
        ("medium", "tripped"),
        ("small", "tripped"),
    ]


def test_closing_an_access_log_stuck_on_a_pipe_nobody_reads_is_bounded_and_counts_what_it_lost() -> None:
    """Its writer is stuck in a write (the pipe full): close() never writes itself, gives the
    writer up once nothing moved for a second rather than the whole CLOSE_TIMEOUT, and counts
    every line it did not write as dropped."""
    r, w = os.pipe()
    log = AccessLog("stalled", stream=os.fdopen(w, "w"))
    try:
        for i in range(1000):  # about 420 KB: several times what the pipe holds
            log.write({"n": i, "pad": "x" * 400})
        began = time.monotonic()
        log.close()
        took = time.monotonic() - began
        assert took < CLOSE_TIMEOUT, took
        assert log.dropped > 0 and log.written + log.dropped == 1000
    finally:
        os.close(r)  # the stuck write fails now (a broken pipe), and the thread ends


def test_an_access_log_fifo_is_refused_without_a_reader_and_written_with_one(tmp_path: Path) -> None:
    fifo = tmp_path / "access.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as e:  # opening it for writing would wait for a reader
        AccessLog(str(fifo))
    assert str(e.value) == (
        f"{fifo}: gateway.access_log: cannot open the access log: "
        "it is a FIFO (named pipe) that nothing reads; start its reader first"
    )
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        log = AccessLog(str(fifo))
        log.write({"n": 1})
        log.close()
        assert os.read(r, 1000) == b'{"n":1}\n' and log.written == 1
    finally:
        os.close(r)


@pytest.mark.parametrize(
    "wall", [0.0, 1.9999994, 1.9999995, 86399.9995, 1767225599.9999996, 1767225600.0005, 253402300790.999]
)
def test_a_lines_time_is_iso_8601_in_utc_to_the_millisecond(wall: float) -> None:
    walls = [wall, *(wall + random.Random(wall).random() * 3 for _ in range(2000))]
    for w in walls:  # the second's part is formatted once: the same text as formatting it whole
        assert log_time(w) == datetime.datetime.fromtimestamp(w, datetime.UTC).isoformat(
            timespec="milliseconds"
        ).replace("+00:00", "Z")
