"""Runners sharing one job in PostgreSQL: through the real client and simulator, and the
commands that read a job (list, show, export, report, attach) reading it back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psycopg
import pytest

from capmon import cli
from capmon.batch.commands import show_job
from capmon.batch.export import export_job
from capmon.batch.options import RunnerOptions
from capmon.batch.runner import BatchRunner
from capmon.batch.store import PgLocation, read_progress
from capmon.core.types.events import BatchProgress, Notice
from capmon.report import ReportOptions, run_report
from tests.batch.helpers import Recorder, client_for, scenario_app, write_items

N = 60


async def panel_shows(progress: BatchProgress) -> None:
    """The dashboard's batch panel, as `capmon --attach JOB` fills it, shows every worker's share."""
    from textual.app import App, ComposeResult

    from capmon.tui.widgets.batch_panel import BatchPanel
    from tests.tui.screen_text import screen_text

    class Panel(App[None]):
        def compose(self) -> ComposeResult:
            yield BatchPanel(id="batch")

    app = Panel()
    async with app.run_test(size=(120, 14)) as pilot:
        app.query_one(BatchPanel).show(progress, can_pause=False)
        await pilot.pause()
        shown = screen_text(app)
    assert "workers: " in shown
    for label, n in progress.workers:
        assert f"{label} {n}" in shown


async def test_two_workers_share_a_job_each_item_once_in_input_order(
    tmp_path: Path, pg_db: PgLocation, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_items(tmp_path / "in.jsonl", N)
    rec = Recorder(scenario_app(latency=0.01))
    async with client_for(rec) as one, client_for(rec) as two:
        runners = [
            BatchRunner(c, pg_db, "j", RunnerOptions(input_path=src, concurrency=4, lease_ttl=2.0)) for c in (one, two)
        ]
        summaries = await asyncio.gather(*(r.run() for r in runners))
    assert {s.state for s in summaries} == {"finished"}
    assert sum(s.sent for s in summaries) == N  # nothing was sent twice
    assert all(s.sent > 0 for s in summaries)
    assert sorted(rec.items()) == [f"it-{i:04d}" for i in range(1, N + 1)]
    out = tmp_path / "out.jsonl"
    summary = export_job(pg_db, "j", out)
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert (summary.done, ids) == (N, [f"it-{i:04d}" for i in range(1, N + 1)])
    progress = read_progress(pg_db, "j")
    assert (progress.state, progress.done, sum(n for _, n in progress.workers)) == ("finished", N, N)
    assert len(progress.workers) == 2
    await panel_shows(progress)
    show_job(pg_db, "j")
    assert run_report(ReportOptions(job="j", db=pg_db)) == 0
    shown = capsys.readouterr().out
    assert "state      finished" in shown and "workers    " in shown
    assert f"job j: {N} items, {N} done, 0 failed" in shown


async def test_connections_cut_again_and_again_pause_the_worker_and_lose_or_double_nothing(
    tmp_path: Path, pg_db: PgLocation, pg_url: str
) -> None:
    n = 40
    src = write_items(tmp_path / "in.jsonl", n)
    rec = Recorder(scenario_app(latency=0.02))
    cuts = 0

    async def cut_every_connection() -> None:
        nonlocal cuts
        for _ in range(5):
            await asyncio.sleep(0.2)
            with psycopg.connect(pg_url, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                    (f"capmon-batch {pg_db.schema}",),
                ).fetchall()
            cuts += len(killed)

    async with client_for(rec) as client:
        notes: list[str] = []
        client.bus.subscribe(lambda e: notes.append(e.message) if isinstance(e, Notice) else None)
        runner = BatchRunner(client, pg_db, "j", RunnerOptions(input_path=src, concurrency=4, rate=60.0))
        cutter = asyncio.create_task(cut_every_connection())
        summary = await runner.run()
        cutter.cancel()
    assert summary.state == "finished" and cuts >= 2
    assert any("sending paused" in m for m in notes) and any("saved again" in m for m in notes), notes
    out = tmp_path / "out.jsonl"
    export_job(pg_db, "j", out)
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [f"it-{i:04d}" for i in range(1, n + 1)]
    assert read_progress(pg_db, "j").done == n


def test_a_url_with_a_password_on_the_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["batch", "list", "--db", "postgresql://postgres:hunter2pw@127.0.0.1:5432/test"])
    err = capsys.readouterr().err
    assert code == 2 and "hunter2pw" not in err
    assert err.count("\n") == 1 and "holds a password" in err


@pytest.mark.parametrize(
    "url", ["postgresql://postgres:hunter2pw@127.0.0.1:1/test", "postgresql://postgres:hunter2pw@127.0.0.1:5432/nodb_x"]
)
def test_a_wrong_url_is_one_line_and_exit_2_without_the_password(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    monkeypatch.setenv("JOBS_URL", url)
    for argv in (["batch", "list"], ["batch", "show", "j"], ["report", "j"]):
        code = cli.main([*argv, "--db-url-env", "JOBS_URL"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "hunter2pw" not in err and err.count("\n") == 1
        assert err.startswith("capmon: postgresql://postgres@127.0.0.1:") and "cannot connect" in err


async def test_a_worker_with_another_input_is_refused_and_sends_nothing(tmp_path: Path, pg_db: PgLocation) -> None:
    from capmon.core.base.exceptions import BatchError

    src = write_items(tmp_path / "in.jsonl", 10)
    other = write_items(tmp_path / "other.jsonl", 11)  # another machine's copy, one line longer
    rec = Recorder(scenario_app(latency=0.001))
    async with client_for(rec) as client:
        await BatchRunner(client, pg_db, "j", RunnerOptions(input_path=src, concurrency=2)).run()
        sent = len(rec.items())
        with pytest.raises(BatchError, match="is a different file"):
            await BatchRunner(client, pg_db, "j", RunnerOptions(input_path=other, concurrency=2)).run()
    assert len(rec.items()) == sent == 10
