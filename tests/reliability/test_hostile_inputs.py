"""Small things a hostile user tries: ids and messages with terminal escapes, a BOM, a
UTF-16 or binary input, `capmon --attach` without a terminal."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from capmon.batch import BatchRunner, JobStore, commands
from capmon.batch.options import RunnerOptions
from capmon.cli import main
from capmon.core.base.exceptions import BatchError
from capmon.report import build_item_report, build_report, format_item, format_report
from tests.batch.helpers import client_for, item, rows, write_jsonl
from tests.support.configs import write_config
from tests.support.scripted import Reply, Script, build_app, ok

EVIL_IDS = ["two\nlines", "\x1b[31mred\x1b[0m", "bell\x07", "rtl\u202eevil", "tab\there"]


def _no_control(text: str) -> None:
    for line in text.splitlines():
        assert all(c == "\t" or c.isprintable() for c in line if c not in "\t"), repr(line)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text


@pytest.mark.looptime
async def test_report_text_escapes_control_characters_in_ids_and_messages(tmp_path: Path) -> None:
    script = Script()

    def reply(n: int, body: dict) -> Reply:
        if body["messages"][-1]["content"] == "tab\there":
            return Reply(400, {"error": {"message": "bad \x1b[2J\x1b[Hcontent", "code": "invalid_value"}})
        return ok(body["model"])

    script.set("flagship", reply)
    db = tmp_path / "jobs.db"
    src = write_jsonl(tmp_path / "in.jsonl", [item(i) for i in EVIL_IDS] + ['{"id": "\\u001b]0;title\\u0007", "oops"'])
    async with client_for(build_app(script)) as client:
        await BatchRunner(client, db, "j", RunnerOptions(input_path=src)).run()
    with JobStore(db, readonly=True) as store:
        report = build_report(store, "j")
        text = format_report(report)
        items = [format_item(build_item_report(store, "j", i)) for i in EVIL_IDS]
    _no_control(text)
    assert "'two\\nlines'" in text and "'\\x1b[31mred\\x1b[0m'" in text  # as repr shows them
    assert "bad \\x1b[2J\\x1b[Hcontent" in text
    for shown in items:
        _no_control(shown)
    assert items[0].splitlines()[0].startswith("item 'two\\nlines' (line 1) of job j: done")

    # `capmon batch show` and the failure list printed after a run, too.
    out = io.StringIO()
    commands.show_job(db, "j", out)
    _no_control(out.getvalue())
    _no_control(commands._failures(db, "j"))
    # The data itself is kept as it was: JSON output round-trips the raw ids.
    assert {m for r in report.models for m in r.items} >= {"two\nlines", "\x1b[31mred\x1b[0m"}


@pytest.mark.looptime
async def test_a_utf8_bom_does_not_fail_line_1(tmp_path: Path) -> None:
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(item(i)) for i in range(1, 4)).encode() + b"\n")
    async with client_for(build_app(Script())) as client:
        summary = await BatchRunner(client, tmp_path / "db", "j", RunnerOptions(input_path=src)).run()
    assert (summary.done, summary.failed) == (3, 0)
    assert rows(tmp_path / "db", "SELECT id, line FROM items ORDER BY key")[0] == ("it-0001", 1)


def _utf16(tmp: Path) -> Path:
    p = tmp / "u16.jsonl"
    p.write_bytes("\n".join(json.dumps(item(i)) for i in range(1, 4)).encode("utf-16"))
    return p


def _utf16_no_bom(tmp: Path) -> Path:
    p = tmp / "u16le.jsonl"
    p.write_bytes("\n".join(json.dumps(item(i)) for i in range(1, 4)).encode("utf-16-le"))
    return p


def _gzip(tmp: Path) -> Path:
    p = tmp / "items.jsonl"  # a compressed file under a .jsonl name
    p.write_bytes(gzip.compress("\n".join(json.dumps(item(i)) for i in range(1, 40)).encode()))
    return p


def _binary(tmp: Path) -> Path:
    p = tmp / "blob.jsonl"
    p.write_bytes(bytes(range(256)) * 8)
    return p


@pytest.mark.parametrize(
    "make, expected",
    [
        (_utf16, "UTF-16"),
        (_utf16_no_bom, "UTF-16"),
        (_gzip, "gzip"),
        (_binary, "not a text file"),
    ],
)
@pytest.mark.looptime
async def test_a_utf16_or_binary_input_is_one_whole_file_error(tmp_path: Path, make, expected: str) -> None:  # type: ignore[no-untyped-def]
    src = make(tmp_path)
    script = Script()
    async with client_for(build_app(script)) as client:
        with pytest.raises(BatchError) as e:
            await BatchRunner(client, tmp_path / "db", "j", RunnerOptions(input_path=src)).run()
    message = str(e.value)
    assert message.startswith(f"{src}: ") and expected in message and "UTF-8" in message and "\n" not in message
    assert not script.seen and rows(tmp_path / "db", "SELECT count(*) FROM jobs") == [(0,)]


def test_a_utf16_input_exits_2_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _utf16(tmp_path)
    cfg = write_config(
        tmp_path / "c.toml", "http://127.0.0.1:9/v1", simulated=True, keys=[("CAPMON_TEST_UNSET", "k")], models=["m"]
    )
    assert main(["batch", "run", str(src), "--db", str(tmp_path / "db"), "--config", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "UTF-16" in err and "Traceback" not in err


def test_attach_without_a_terminal_prints_that_jobs_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "jobs.db"
    monkeypatch.setenv("CAPMON_DB", str(db))
    with JobStore(db) as store:
        info = store.create_job(
            "nightly",
            input_path=str(tmp_path / "in.jsonl"),
            input_size=1,
            fingerprint="x",
            settings={"concurrency": 4},
            now=1.0,
        )
        store.ingest_chunk(
            info.id,
            [
                (1, "a", "done", "[]", None, None, None, None, None, None),
                (2, "b", "pending", "[]", None, None, None, None, None, None),
            ],
            offset=1,
            line=2,
            now=1.0,
        )
        store.set_job(info.id, state="stopped")
    assert main(["--attach", "nightly"]) == 0
    out = capsys.readouterr().out
    assert "job        nightly" in out and "2 total: 1 done" in out
    assert "flagship" not in out  # not the demo's snapshot
    assert main(["--attach", "ghost"]) == 2
    assert "no job named 'ghost'" in capsys.readouterr().err


@pytest.mark.looptime
async def test_half_a_utf16_pair_fails_its_line_not_the_job(tmp_path: Path) -> None:
    """A JSON "\\ud800" decodes to a lone surrogate, which SQLite cannot store: that line fails, the rest run."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            '{"id": "a\\ud800", "messages": [{"role": "user", "content": "x"}]}',
            '{"id": "b", "messages": [{"role": "user", "content": "y\\udfff"}]}',
            '{"id": "c", "messages": [["\\ud800"]]}',
            '{"id": "d", "messages": [{"role": "user", "content": "fine"}], "metadata": {"k": "\\udc00"}}',
            item("ok"),
        ],
    )
    async with client_for(build_app(Script())) as client:
        summary = await BatchRunner(client, tmp_path / "db", "j", RunnerOptions(input_path=src)).run()
    assert (summary.done, summary.failed) == (1, 4)
    failed = dict(rows(tmp_path / "db", "SELECT line, error_message FROM items WHERE state = 'failed'"))
    assert "\\ud800" in failed[1] and failed[1].startswith("id: ")
    assert failed[2].startswith("messages: ") and failed[4].startswith("metadata: ")
    assert failed[3].startswith("messages[0]: expected an object")
