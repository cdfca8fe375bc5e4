"""A recognisable key through whole batch jobs, then a search of everything a job leaves
behind: log records (every logger, DEBUG), exceptions, the job database's bytes (main
file, -wal, -shm), the export, `capmon report --json/--csv`, `capmon batch show/list`,
`capmon status --json`, and a screenshot (SVG) of the dashboard running a job on a live
engine. The server echoes the key in its error bodies and headers; the key appears nowhere.

The endpoint is a real (not ``simulated``) endpoint: a scripted server in this process on
a loopback port, answering each item by its id (the user message) with success, a
fallback after an echoing failure, or an echoing failure on every model.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from capmon.batch.options import RunnerOptions
from capmon.batch.runner import BatchRunner
from capmon.cli import main
from capmon.core.base.exceptions import BatchError
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import load_config
from capmon.tui.app import CapmonApp
from capmon.tui.source import LiveSource
from tests.batch.helpers import rows, write_items
from tests.reliability.test_secrets import echoes
from tests.support import configs
from tests.support.scripted import Reply, Script, ok, serve

KEY = "sk-SECRET-canary-0987654321"
ENV = {"CANARY_KEY": KEY}
NEEDLES = (KEY, KEY[3:], "SECRET-canary", "canary-0987", "0987654321", KEY[-12:])
ECHO = echoes(KEY)
N = 48

# Per item (its number mod 8): what the flagship says, and whether every model says it.
PLAN: dict[int, tuple[str, bool]] = {
    0: ("too_large", True),  # fails: no model takes it
    1: ("bad_request", True),  # fails: not worth another model
    2: ("rate_limited", False),  # the others answer
    3: ("capacity", False),
    4: ("transient", False),
    5: ("broken-200", False),
    6: ("error-200", False),
    7: ("", False),  # plain success
}


def _number(body: dict[str, Any]) -> int:
    return int(str(body["messages"][-1]["content"]).removeprefix("it-"))


def mixed_script() -> Script:
    script = Script()
    echoed: set[int] = set()  # items whose flagship echo was sent: a retry succeeds (keeps the job short)

    def rule(model: str) -> Any:
        def reply(n: int, body: dict[str, Any]) -> Reply:
            if body["messages"][-1]["content"] == "ping":  # the dashboard's health probes
                return ok(model, "pong")
            number = _number(body)
            kind, everywhere = PLAN[number % 8]
            if kind and everywhere:
                return ECHO[kind]
            if kind and model == "flagship" and number not in echoed:
                echoed.add(number)
                return ECHO[kind]
            return ok(model, f"answer from {model}")

        return reply

    for m in ("flagship", "medium", "small"):
        script.set(m, rule(m))
    return script


def write_config(path: Path, url: str) -> Path:
    return configs.write_config(
        path,
        url,
        keys=[("CANARY_KEY", "canary")],
        client={"max_attempts": 3, "deadline": 20.0},
        breaker={"cooldown": 0.5, "ramp_duration": 0.5},
        dashboard={"refresh": 0.1, "probe_interval": 0.3},
    )


class Texts:
    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []

    def add(self, where: str, obj: Any) -> None:
        if isinstance(obj, bytes):
            obj = obj.decode("utf-8", "replace") + "\n" + obj.decode("latin-1")
        self.texts.append((where, obj if isinstance(obj, str) else repr(obj)))

    def add_exception(self, where: str, e: BaseException) -> None:
        self.add(where + " str", str(e))
        self.add(where + " repr", repr(e))
        self.add(where + " traceback", "".join(traceback.format_exception(e)))

    def add_file(self, where: str, path: Path) -> bool:
        if path.exists():
            self.add(where, path.read_bytes())
            return True
        return False

    def leaks(self) -> list[tuple[str, str]]:
        return [
            (where, text[max(0, text.find(n) - 80) : text.find(n) + 40])
            for where, text in self.texts
            for n in NEEDLES
            if n in text
        ]


def _cli_in_process(argv: tuple[str, ...]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


async def cli(*argv: str) -> tuple[int, str, str]:
    """The command line, run in this process (in a thread, as `capmon` runs it: its own event
    loop) so that its log records are searched too; a subprocess per command cost most of
    this test's time in interpreter starts."""
    return await asyncio.wait_for(asyncio.to_thread(_cli_in_process, argv), 60)


async def run_job(client: FallbackClient, db: Path, job: str, src: Path, texts: Texts) -> Any:
    runner = BatchRunner(client, db, job, RunnerOptions(input_path=src, concurrency=6, park_base=0.05, park_cap=0.2))
    try:
        summary = await asyncio.wait_for(runner.run(), 60)
    except BatchError as e:  # a halted job raises: its message is searched too
        texts.add_exception(f"job {job}", e)
        return None
    texts.add(f"job {job} summary", summary)
    return summary


async def sample_wal(db: Path, texts: Texts, stop: asyncio.Event) -> int:
    """The -wal file while the job runs (it is checkpointed and removed when the job ends)."""
    wal, last, seen = Path(str(db) + "-wal"), b"", 0
    while not stop.is_set():
        try:
            data = wal.read_bytes()
        except FileNotFoundError:
            data = b""
        if data and data != last:
            texts.texts.append(("jobs.db-wal while running", data.decode("latin-1")))
            last, seen = data, seen + 1
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass
    return seen


@pytest.mark.timeout(180)  # about 20 s; three times that and more on a loaded machine
async def test_a_batch_job_leaves_the_key_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CANARY_KEY", KEY)  # the command line reads the key from the environment
    caplog.set_level(logging.DEBUG)
    for name in ("capmon", "httpx", "httpcore", "asyncio", "textual"):
        caplog.set_level(logging.DEBUG, logger=name)  # restored after the test, as the root's is
    texts = Texts()
    db, out = tmp_path / "jobs.db", tmp_path / "out.jsonl"
    src = write_items(tmp_path / "in.jsonl", N)
    refused_src = write_items(tmp_path / "refused.jsonl", 6)

    script = mixed_script()
    async with serve(script) as url:
        cfg_path = write_config(tmp_path / "config.toml", url)
        config = load_config(cfg_path)

        # 1. a job with every item kind, in this process (its logs are captured)
        async with FallbackClient(config, environ=ENV) as client:
            stop = asyncio.Event()
            sampler = asyncio.create_task(sample_wal(db, texts, stop))
            summary = await run_job(client, db, "mixed", src, texts)
            stop.set()
            assert await sampler > 0, "no -wal file was seen while the job ran"
            texts.add("snapshot", json.dumps(client.snapshot().to_dict(), default=str))
            texts.add("recent events", client.bus.recent())
        assert summary is not None and summary.state == "finished", summary
        assert summary.done == N * 6 // 8 and summary.failed == N * 2 // 8, summary

        # 2. jobs whose key is refused (401 echo) or out of quota: they halt, with a message
        for job, kind in (("refused", "auth"), ("quota", "quota")):
            for m in ("flagship", "medium", "small"):
                script.always(m, ECHO[kind])
            async with FallbackClient(config, environ=ENV) as client:
                await run_job(client, db, job, refused_src, texts)
        script.rules.clear()

        # 3. the command line on the same database and config
        outputs: dict[str, tuple[int, str, str]] = {
            "export": await cli("batch", "export", "mixed", "--db", str(db), "--out", str(out)),
            "list": await cli("batch", "list", "--db", str(db)),
        }
        for job in ("mixed", "refused", "quota"):
            outputs[f"show {job}"] = await cli("batch", "show", job, "--db", str(db))
            outputs[f"report {job}"] = await cli("report", job, "--db", str(db))
            outputs[f"report {job} --json"] = await cli("report", job, "--db", str(db), "--json")
            outputs[f"report {job} --csv"] = await cli("report", job, "--db", str(db), "--csv")
            outputs[f"report {job} --advice"] = await cli("report", job, "--db", str(db), "--advice")
        outputs["report --item"] = await cli("report", "mixed", "--db", str(db), "--item", "it-0003")
        script.always("flagship", ECHO["auth"])
        script.always("medium", ECHO["rate_limited"])
        outputs["status --json"] = await cli("status", "--once", "--json", "--probe", "--config", str(cfg_path))
        outputs["status"] = await cli("status", "--once", "--probe", "--config", str(cfg_path))
        script.rules.clear()
        for where, (code, stdout, stderr) in outputs.items():
            assert code == 0, (where, stderr[-2000:])
            texts.add(f"`{where}` stdout", stdout)
            texts.add(f"`{where}` stderr", stderr)

        # 4. the dashboard running a job on a live engine with this config
        tui_src = write_items(tmp_path / "tui.jsonl", 24)
        source = LiveSource(config, job_input=tui_src, db_path=tmp_path / "tui.db", environ=ENV)
        app = CapmonApp(source, refresh=0.1)
        script_set = mixed_script()
        script.rules.update(script_set.rules)
        async with app.run_test(size=(160, 48)) as pilot:
            deadline = time.monotonic() + 10.0
            while True:
                await pilot.pause(0.1)
                batch = source.batch()
                if batch is not None and batch.total and batch.done + batch.failed >= batch.total:
                    break
                if time.monotonic() > deadline:
                    break
            svg = app.export_screenshot()
            texts.add("dashboard events", source.bus.recent())
            texts.add("dashboard snapshot", json.dumps(source.snapshot().to_dict(), default=str))
            await pilot.press("q")
            await pilot.pause()
        assert batch is not None and batch.done > 0, batch
        assert "flagship" in svg and "medium" in svg  # the models table was drawn
        texts.add("dashboard svg", svg)
        texts.add_file("tui.db", tmp_path / "tui.db")

    # the key was really sent, and only as the key
    assert {s.key for s in script.seen} == {KEY}
    # every failure kind really happened, and was recorded
    kinds = {k for (k,) in rows(db, "SELECT DISTINCT kind FROM attempts WHERE kind IS NOT NULL")}
    assert kinds >= {"rate_limited", "capacity", "too_large", "bad_request", "transient", "auth", "quota"}, kinds
    halted = dict(rows(db, "SELECT name, message FROM jobs"))
    assert halted["refused"] and halted["quota"], halted  # they say why they stopped

    for suffix in ("", "-wal", "-shm", "-journal"):
        texts.add_file(f"jobs.db{suffix}", Path(str(db) + suffix))
    assert texts.add_file("export", out)
    for record in caplog.records:
        texts.add(f"log {record.name}", record.getMessage())
        if record.exc_info:
            texts.add(f"log {record.name} exc", "".join(traceback.format_exception(*record.exc_info)))
    assert caplog.records, "nothing was logged: the capture is not working"

    leaks = texts.leaks()
    assert not leaks, f"the key leaked in {len(leaks)} place(s): {sorted({w for w, _ in leaks})}, e.g. {leaks[:4]}"
