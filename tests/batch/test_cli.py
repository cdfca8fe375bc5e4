"""`capmon batch ...` and `capmon report` as a user runs them (in-process, real time, embedded simulator)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from capmon.cli import main
from tests.batch.helpers import item, write_items, write_jsonl
from tests.support.configs import shipped_config

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """
name = "cli-fast"
keys = ["*"]
[[models]]
name = "sim-flagship"
slots = 64
base_latency = 0.005
per_token = 0.0
noise = 0.0
answer_tokens = 10
[[models]]
name = "sim-claude"
api = "anthropic"
slots = 64
base_latency = 0.005
per_token = 0.0
answer_tokens = 10
[[models]]
name = "sim-medium"
slots = 64
base_latency = 0.005
per_token = 0.0
answer_tokens = 10
[[models]]
name = "sim-small"
slots = 64
base_latency = 0.005
per_token = 0.0
answer_tokens = 10
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Path]:
    shipped_config(tmp_path, SCENARIO)
    return {"config": tmp_path / "config.toml", "db": tmp_path / "jobs.db", "dir": tmp_path}


def batch(env: dict[str, Path], *argv: str) -> int:
    return main(
        [
            "batch",
            *argv,
            "--db",
            str(env["db"]),
            *(["--config", str(env["config"])] if argv[0] in ("run", "resume", "compare") else []),
        ]
    )


def test_run_exports_when_finished_and_running_again_sends_nothing(
    env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_items(env["dir"] / "nightly.jsonl", 40, metadata={"k": 1})
    out = env["dir"] / "out.jsonl"
    assert batch(env, "run", str(src), "--out", str(out), "--concurrency", "8", "--no-progress") == 0
    err = capsys.readouterr().err
    assert "job 'nightly' finished: 40 items, 40 done, 0 failed" in err and "exported 40 records" in err
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [f"it-{i:04d}" for i in range(1, 41)]
    assert all(r["model"] == "flagship" and r["content"] and r["metadata"] == {"k": 1} for r in records)

    assert batch(env, "run", str(src), "--no-progress") == 0  # the same command again: a resume
    assert "40 done, 0 failed" in (err := capsys.readouterr().err) and "0 sent" in err

    assert batch(env, "list") == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split() == ["name", "created", "total", "done", "failed", "parked", "state"]
    assert listing[1].split()[0] == "nightly" and listing[1].split()[-5:] == ["40", "40", "0", "0", "finished"]
    assert batch(env, "show", "nightly") == 0
    shown = capsys.readouterr().out
    assert "40 total: 40 done, 0 failed, 0 parked, 0 pending" in shown and "served by  flagship 40" in shown

    again = env["dir"] / "again.jsonl"
    assert batch(env, "export", "nightly", "--out", str(again)) == 0
    assert again.read_text() == out.read_text()
    assert main(["report", "nightly", "--db", str(env["db"]), "--advice"]) == 0
    assert "flagship" in capsys.readouterr().out


def test_failed_items_exit_1_and_name_their_lines(env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(env["dir"] / "mixed.jsonl", [item(1), "{oops", item(3)])
    assert batch(env, "run", str(src), "--no-progress") == 1
    err = capsys.readouterr().err
    assert "2 done, 1 failed" in err and "line 2 (line-2): bad_input: not valid JSON" in err


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([item("a"), item("b"), item("a")], "duplicate ids: 'a' on lines 1, 3"),
        ([], "is empty"),
    ],
)
def test_bad_input_files_exit_2_before_anything_is_sent(
    env: dict[str, Path], capsys: pytest.CaptureFixture[str], rows: list, expected: str
) -> None:
    src = write_jsonl(env["dir"] / "bad.jsonl", rows)
    assert batch(env, "run", str(src), "--no-progress") == 2
    assert expected in capsys.readouterr().err
    assert sqlite3.connect(env["db"]).execute("SELECT count(*) FROM items").fetchone() == (0,)


def test_an_unwritable_output_is_refused_before_anything_is_read_or_sent(
    env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_items(env["dir"] / "in.jsonl", 3)
    assert batch(env, "run", str(src), "--out", str(env["dir"] / "nope" / "out.jsonl")) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "the folder" in err and "does not exist" in err
    assert not env["db"].exists()


def test_a_corrupt_database_and_an_unknown_job_exit_2(env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    env["db"].write_bytes(b"garbage" * 1000)
    assert batch(env, "run", str(write_items(env["dir"] / "in.jsonl", 3))) == 2
    assert "not a capmon job database, or it is corrupt" in capsys.readouterr().err
    env["db"].unlink()
    assert batch(env, "resume", "ghost") == 2
    assert "no job database here" in capsys.readouterr().err


def test_a_missing_input_and_a_bad_window_exit_2(env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert batch(env, "run", str(env["dir"] / "missing.jsonl")) == 2
    assert "no such file" in capsys.readouterr().err
    assert batch(env, "run", str(write_items(env["dir"] / "in.jsonl", 1)), "--window", "late") == 2
    assert "--window" in capsys.readouterr().err


def test_a_changed_input_exits_2_naming_the_line_and_accept_changed_input_takes_it(
    env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_items(env["dir"] / "nightly.jsonl", 20)
    assert batch(env, "run", str(src), "--no-progress") == 0
    capsys.readouterr()
    lines = src.read_text().splitlines()
    lines[11] = lines[11].replace('"content": "it-0012"', '"content": "it-001X"')
    src.write_text("\n".join(lines[:15] + lines[16:]) + "\n")  # line 12 edited, line 16 removed
    for argv in (("run", str(src)), ("resume", "nightly")):
        assert batch(env, *argv, "--no-progress") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "line 12 differs" in err and "--accept-changed-input" in err
    out = env["dir"] / "out.jsonl"
    assert batch(env, "resume", "nightly", "--accept-changed-input", "--out", str(out), "--no-progress") == 0
    err = capsys.readouterr().err
    assert "0 added, 1 removed, 1 edited (sent again)" in err and "1 sent" in err
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in records if r.get("removed")] == ["it-0016"] and len(records) == 20
    assert batch(env, "show", "nightly") == 0
    assert "19 total: 19 done" in (shown := capsys.readouterr().out) and "1 removed from the input" in shown


def test_remap_on_the_command_line(env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(env["dir"] / "in.jsonl", [item(1, model="gone"), item(2)])
    assert batch(env, "run", str(src), "--remap", "nonsense", "--no-progress") == 2
    assert "--remap nonsense: expected OLD=NEW" in capsys.readouterr().err
    # An item naming a model the config does not have is a bad line at ingest; --remap is for models that leave later.
    assert batch(env, "run", str(src), "--no-progress") == 1
    assert "model: 'gone' is not in the config" in capsys.readouterr().err


def test_a_refused_key_halts_with_its_line_printed_once(
    env: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = env["dir"] / "fast.toml"
    scenario.write_text(scenario.read_text().replace('keys = ["*"]', 'keys = ["sk-the-right-one"]'))
    monkeypatch.setenv("CAPMON_SIM_API_KEY", "sk-a-wrong-one")
    assert batch(env, "run", str(write_items(env["dir"] / "in.jsonl", 5)), "--no-progress") == 2
    err = capsys.readouterr().err
    assert "the provider refused the key" in err and err.count("halted") == 1, err  # it was printed twice


def test_a_full_disk_halts_with_its_line_printed_once(
    env: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from capmon.batch.options import RunnerOptions
    from capmon.batch.writer import ResultWriter

    # The disk fills once 5 results are saved (statvfs says so), and the job gives up after 0.3 s, not 30.
    monkeypatch.setattr(ResultWriter, "free_bytes", lambda self: 0 if self.done >= 5 else 1 << 30)
    monkeypatch.setitem(RunnerOptions.__init__.__kwdefaults__, "write_give_up", 0.3)
    src = write_items(env["dir"] / "in.jsonl", 200)
    assert batch(env, "run", str(src), "--no-progress", "--concurrency", "2") == 2
    err = capsys.readouterr().err
    assert "database or disk is full" in err and err.count("halted") == 1, err  # it was printed twice


def test_a_read_only_folder_is_named_as_such(env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    import contextlib
    import os

    from tests.reliability.test_disk_full import tmpfs

    with contextlib.ExitStack() as stack:
        if os.geteuid() == 0:  # root writes into any folder: only a read-only mount refuses it
            folder = stack.enter_context(tmpfs(env["dir"] / "ro", "1m", read_only=True))
        else:
            folder = env["dir"] / "ro"
            folder.mkdir()
            folder.chmod(0o555)
            stack.callback(folder.chmod, 0o755)
        env["db"] = folder / "jobs.db"
        assert batch(env, "run", str(write_items(env["dir"] / "in.jsonl", 3)), "--no-progress") == 2
    err = capsys.readouterr().err
    assert f"the folder {folder} is not writable" in err and "--db" in err, err  # was: "unable to open database file"


def test_the_command_to_go_on_names_a_postgresql_store_as_it_was_named() -> None:
    from capmon.batch.commands import _db_flag
    from capmon.batch.store import locate

    env = {"JOBS_URL": "postgresql://capmon:pw-123456@db.internal:5432/jobs", "CAPMON_DB": ""}
    assert _db_flag(locate(url_env="JOBS_URL", environ=env)) == " --db-url-env JOBS_URL"  # the password stays there
    assert _db_flag(locate("postgresql://capmon@db.internal/jobs", environ=env)) == (
        " --db postgresql://capmon@db.internal/jobs"
    )
    assert _db_flag(locate(environ={"CAPMON_DB": env["JOBS_URL"]})) == ""  # the next command reads $CAPMON_DB too


def test_compare_runs_from_the_command_line(env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    src = write_items(env["dir"] / "nightly.jsonl", 5)
    assert batch(env, "run", str(src), "--no-progress") == 0
    capsys.readouterr()
    # Every item served by its first choice: nothing to compare, and nothing sent.
    assert batch(env, "compare", "nightly", "--sample", "3", "--seed", "7") == 0
    assert "job 'nightly': nothing compared" in capsys.readouterr().err
    assert batch(env, "compare", "nightly", "--sample", "0") == 2
    assert "sample" in capsys.readouterr().err
