"""One engine per process, however many clients and threads: 32 threads share one sync
client; a forked child builds its own engine instead of using the parent's; requests from
another loop or thread reach the one engine across threads, and what would hang is a clear
error; and a process that used the clients exits without a warning."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import openai
import pytest

import capmon
from capmon.inprocess.home import RUNTIME, THREAD_NAME
from tests.sdk.helpers import ANSWER_TOKENS, HELLO, config, slow, write_config

ROOT = Path(__file__).resolve().parents[2]


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def test_32_threads_share_one_sync_client_and_one_engine(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    built = RUNTIME.built
    sdk = capmon.openai_client(cfg)
    seen: list[tuple[str, int, int]] = []
    errors: list[BaseException] = []
    go = threading.Barrier(32)

    def work() -> None:
        try:
            go.wait()
            r = sdk.chat.completions.create(model="auto", messages=HELLO)
            streamed = "".join(
                c.choices[0].delta.content or ""
                for c in sdk.chat.completions.create(model="medium", messages=HELLO, stream=True)
                if c.choices
            )
            seen.append((r.choices[0].message.content or "", len(streamed.split()), id(capmon.inprocess.engine())))
        except BaseException as e:  # reported below, with the thread's own traceback
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert len(seen) == 32 and all(len(text.split()) == ANSWER_TOKENS and n == ANSWER_TOKENS for text, n, _ in seen)
    assert len({engine for _, _, engine in seen}) == 1 and RUNTIME.built == built + 1
    assert len(engine_threads()) == 1
    snap = capmon.inprocess.engine().client.snapshot()  # type: ignore[union-attr]
    assert snap.requests == 64 and snap.succeeded == 64 and snap.in_flight == 0


def test_a_forked_child_builds_its_own_engine(tmp_path: Path) -> None:
    sdk = capmon.openai_client(config(tmp_path))
    assert sdk.chat.completions.create(model="auto", messages=HELLO).choices[0].message.content
    parent_engine = capmon.inprocess.engine()
    built = RUNTIME.built
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        try:
            signal.alarm(20)
            os.close(read)
            r = sdk.chat.completions.with_raw_response.create(model="medium", messages=HELLO)
            mine = capmon.inprocess.engine()
            report = {
                "text": r.parse().choices[0].message.content,
                "model": r.headers["x-capmon-model"],
                "built": RUNTIME.built,
                "own": mine is not None and mine is not parent_engine and mine.client is not parent_engine.client,  # type: ignore[union-attr]
                "threads": len(engine_threads()),
                "requests": mine.client.snapshot().requests if mine else None,
            }
        except BaseException as e:
            report = {"error": repr(e)}
        os.write(write, json.dumps(report).encode())
        os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 30)
        got = os.read(read, 65536) if ready else b""
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    report = json.loads(got or b'{"error": "no report"}')
    assert "error" not in report, report
    assert report["model"] == "medium" and len(report["text"].split()) == ANSWER_TOKENS
    assert report["built"] == built + 1 and report["own"] and report["threads"] == 1 and report["requests"] == 1
    # the parent's engine is untouched and goes on serving
    assert capmon.inprocess.engine() is parent_engine and RUNTIME.built == built
    assert sdk.chat.completions.create(model="auto", messages=HELLO).choices[0].message.content
    assert parent_engine.client.snapshot().requests == 2  # type: ignore[union-attr]


def test_other_loops_and_threads_reach_the_one_engine_and_what_would_hang_is_refused(tmp_path: Path) -> None:
    """The engine starts on a caller's loop (in a thread of its own here); a sync client in
    another thread and an async client in another loop both reach it; a sync client inside
    its loop is refused (it would block that loop forever); when that loop ends, so does the
    engine, and the next request builds one on the background thread."""
    cfg = config(tmp_path)
    built = RUNTIME.built
    started, stop = threading.Event(), threading.Event()
    inside: list[str] = []

    async def home_loop() -> None:
        sdk = capmon.async_openai_client(cfg)
        await sdk.chat.completions.create(model="auto", messages=HELLO)
        with pytest.raises(openai.APIConnectionError) as info:
            capmon.openai_client().chat.completions.create(model="auto", messages=HELLO)
        inside.append(str(info.value.__cause__))
        started.set()
        while not stop.is_set():
            await asyncio.sleep(0.01)

    home = threading.Thread(target=lambda: asyncio.run(home_loop()))
    home.start()
    assert started.wait(20)
    try:
        assert "inside the event loop that runs capmon's engine" in inside[0]
        sync = capmon.openai_client()
        assert sync.chat.completions.create(model="medium", messages=HELLO).choices[0].message.content

        async def elsewhere() -> str | None:
            r = await capmon.async_openai_client().chat.completions.create(model="medium", messages=HELLO)
            return r.choices[0].message.content

        assert asyncio.run(elsewhere())
        assert RUNTIME.built == built + 1 and not engine_threads()  # no background thread: the caller's loop serves
        assert capmon.inprocess.engine().client.snapshot().requests == 3  # type: ignore[union-attr]
    finally:
        stop.set()
        home.join(20)
    assert capmon.inprocess.engine() is None  # it closed with its loop
    assert sync.chat.completions.create(model="auto", messages=HELLO).choices[0].message.content
    assert RUNTIME.built == built + 2 and len(engine_threads()) == 1


def test_the_sdks_timeout_bounds_the_wait_and_cancels_the_attempt(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    sdk = capmon.openai_client(cfg, timeout=0.2)
    assert sdk.chat.completions.create(model="auto", messages=HELLO).choices[0].message.content
    slow(cfg, "flagship", 0.5)
    with pytest.raises(openai.APITimeoutError):
        sdk.chat.completions.create(model="auto", messages=HELLO)
    # the caller went away: the engine cancelled its attempt and gave the slot back
    for _ in range(200):
        if capmon.inprocess.call_in_engine(lambda e: e.client.snapshot().in_flight) == 0:
            break
        threading.Event().wait(0.01)
    snap = capmon.inprocess.call_in_engine(lambda e: e.client.snapshot())
    assert snap.in_flight == 0 and snap.requests == 2 and snap.succeeded == 1  # not left to answer in 0.5 s


def test_an_engine_on_a_loop_that_is_not_running_is_a_clear_error_and_closes_there(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    loop = asyncio.new_event_loop()
    try:
        sdk = capmon.async_openai_client(cfg)
        answer = loop.run_until_complete(sdk.chat.completions.create(model="auto", messages=HELLO))
        assert answer.choices[0].message.content  # the engine lives on `loop`, which is paused now
        with pytest.raises(openai.APIConnectionError) as info:
            capmon.openai_client().chat.completions.create(model="auto", messages=HELLO)
        assert "event loop that is not running now" in str(info.value.__cause__)
        capmon.close_engine()  # runs that loop until the engine is closed
        assert capmon.inprocess.engine() is None
    finally:
        loop.close()


def test_another_config_while_the_engine_runs_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    sdk = capmon.openai_client(config(tmp_path / "a"))
    assert sdk.chat.completions.create(model="auto", messages=HELLO).choices[0].message.content
    with pytest.raises(capmon.inprocess.InProcessError, match="one engine per process"):
        capmon.anthropic_client(config(tmp_path / "b"))
    capmon.close_engine()
    assert capmon.anthropic_client(config(tmp_path / "b"))  # no engine runs now: the new config is taken


EXIT_SCRIPT = """
import asyncio, json, sys
import capmon

light = [m for m in ("openai", "anthropic", "capmon.inprocess", "capmon.gateway", "starlette") if m in sys.modules]

async def first():  # the engine on asyncio.run's loop, closed when that loop ends
    sdk = capmon.async_openai_client(sys.argv[1])
    hi = [{"role": "user", "content": "hi"}]
    chunks = await sdk.chat.completions.create(model="claude", messages=hi, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

streamed = asyncio.run(first())
# then a sync client: a new engine on the background thread, closed at exit
plain = capmon.openai_client().chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}])
print(json.dumps({"light": light, "streamed": streamed, "plain": plain.choices[0].message.content}))
"""


def test_a_process_exits_cleanly_after_using_the_clients(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default"}  # ResourceWarnings shown
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EXIT_SCRIPT), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    got = json.loads(out.stdout)
    assert got["light"] == []  # `import capmon` imports neither the SDKs nor the gateway
    assert len(got["streamed"].split()) == ANSWER_TOKENS and len(got["plain"].split()) == ANSWER_TOKENS


OPEN_STREAMS_SCRIPT = """
import asyncio, sys
import capmon

config, how = sys.argv[1], sys.argv[2]
hi = [{"role": "user", "content": "hi"}]
streams = []  # open at exit: read to their first chunk, never to their end, never closed

async def open_async(n):
    sdk = capmon.async_openai_client(config)
    for _ in range(n):
        stream = await sdk.chat.completions.create(model="auto", messages=hi, stream=True, max_tokens=1000)
        await stream.__anext__()
        streams.append(stream)

def open_sync(n):
    sdk = capmon.openai_client(config)
    for _ in range(n):
        stream = sdk.chat.completions.create(model="auto", messages=hi, stream=True, max_tokens=1000)
        next(stream)
        streams.append(stream)

if how == "sync and async":  # the engine on capmon's thread; async requests reach it from asyncio.run's loop
    open_sync(8)
    asyncio.run(open_async(8))
else:  # the engine on the first async request's loop, run by hand, not by asyncio.run
    loop = asyncio.new_event_loop()
    loop.run_until_complete(open_async(16))
    if how == "async, the loop closed":
        loop.close()  # with the engine still open on it
print(len(streams))
"""


@pytest.mark.parametrize("how", ["sync and async", "async, the loop left open", "async, the loop closed"])
def test_a_process_exits_quietly_with_16_streams_open(tmp_path: Path, how: str) -> None:
    path = write_config(tmp_path)
    # Answers of 1,000 tokens at 0.02 s each: a stream's first chunk (4 tokens) comes at once, its
    # end 20 s later, so every stream is still open at exit and opening 16 takes about a second.
    scenario = tmp_path / "scenario.toml"
    text = scenario.read_text().replace("per_token = 0.0", "per_token = 0.02")
    scenario.write_text(text.replace(f"answer_tokens = {ANSWER_TOKENS}", "answer_tokens = 1000"))
    # ResourceWarnings shown, but the one for the loop the script leaves open on purpose
    warnings = "default,ignore:unclosed event loop:ResourceWarning"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": warnings}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OPEN_STREAMS_SCRIPT), str(path), how],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        cwd=tmp_path,
    )
    assert (out.returncode, out.stdout.strip()) == (0, "16"), out.stderr
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stderr == "", out.stderr  # nothing destroyed pending, no request's failure logged
