"""BatchRunner against in-process apps, in fast-forwarded time."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from capmon.batch import BatchRunner, JobStore, read_progress
from capmon.batch import ingest as ingest_mod
from capmon.batch.options import RunnerOptions
from capmon.core.base.exceptions import BatchError
from capmon.core.types import events as ev
from capmon.core.types.events import EventBus
from tests.batch.helpers import Recorder, client_for, collect, item, rows, scenario_app, write_items, write_jsonl
from tests.support.clocks import WallClock, local
from tests.support.scripted import OVERLOADED, Reply, Script, build_app, ok

pytestmark = pytest.mark.looptime


async def test_a_job_sends_every_item_once_and_stores_who_served_it(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.05))
    bus = EventBus(history=5000)
    done_events = collect(bus, ev.BatchItemDone)
    progress_events = collect(bus, ev.BatchProgress)
    db = tmp_path / "jobs.db"
    async with client_for(rec, bus=bus) as client:
        runner = BatchRunner(
            client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 120), concurrency=8)
        )
        summary = await runner.run()
    assert (summary.total, summary.done, summary.failed, summary.state) == (120, 120, 0, "finished")
    assert sorted(rec.items()) == [f"it-{i:04d}" for i in range(1, 121)]  # each exactly once
    assert rec.peak <= 8
    stored = rows(db, "SELECT id, state, model, content, attempts FROM items ORDER BY key")
    assert len(stored) == 120 and all(r[1] == "done" and r[2] and r[3] and r[4] >= 1 for r in stored)
    assert dict(summary.per_model) == dict(rows(db, "SELECT model, count(*) FROM items GROUP BY model"))
    assert sorted(e.item_id for e in done_events) == sorted(r[0] for r in stored)
    assert all(e.ok and e.model for e in done_events)
    # About two progress events a second, the last one saying finished.
    elapsed = summary.elapsed
    assert elapsed > 0.5
    assert 1.2 * elapsed <= len(progress_events) <= 2 * elapsed + 3
    assert progress_events[-1].state == "finished" and progress_events[-1].done == 120


async def test_concurrency_bounds_what_is_in_flight_at_the_server(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.2))
    async with client_for(rec, extra="[limiter]\ninitial = 64\nmax = 64") as client:
        runner = BatchRunner(
            client,
            tmp_path / "db",
            "j",
            RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 60), concurrency=3),
        )
        await runner.run()
    assert rec.peak == 3


async def test_rate_limits_how_many_items_start_per_second(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.01))
    async with client_for(rec) as client:
        runner = BatchRunner(
            client,
            tmp_path / "db",
            "j",
            RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 21), concurrency=16, rate=5.0),
        )
        await runner.run()
    starts = sorted(t for t, _, _ in rec.seen)
    assert len(starts) == 21
    assert starts[-1] - starts[0] >= 20 / 5 - 0.05  # 21 starts at 5/s span 4 s
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= 0.2 - 1e-6


async def test_cancelling_stops_cleanly_and_resume_sends_nothing_already_done(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.5))
    db = tmp_path / "jobs.db"
    src = write_items(tmp_path / "in.jsonl", 100)
    async with client_for(rec) as client:
        runner = BatchRunner(client, db, "j", RunnerOptions(input_path=src, concurrency=10))
        task = asyncio.create_task(runner.run())
        await asyncio.sleep(2.25)  # four rounds done, the fifth in flight
        assert runner.progress().in_flight == 10
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        states = dict(rows(db, "SELECT state, count(*) FROM items GROUP BY state"))
        assert states == {"done": 40, "pending": 60}  # the ten in flight went back to pending
        done_before = {r[0] for r in rows(db, "SELECT id FROM items WHERE state = 'done'")}
        assert read_progress(db, "j").state == "stopped"
        sent_before = len(rec.seen)

        again = BatchRunner(client, db, "j", RunnerOptions(input_path=src, concurrency=10))  # the same command again
        summary = await again.run()
    assert summary.done == 100 and summary.sent == 60
    resent = rec.items()[sent_before:]
    assert not done_before & set(resent)
    assert sorted(resent) == sorted({f"it-{i:04d}" for i in range(1, 101)} - done_before)


async def test_items_left_in_flight_by_a_crash_go_back_to_pending(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    rec = Recorder(scenario_app(latency=0.01))
    src = write_items(tmp_path / "in.jsonl", 10)
    async with client_for(rec) as client:
        await BatchRunner(client, db, "j", RunnerOptions(input_path=src)).run()
        # What a kill -9 leaves behind: rows marked in flight, a lease held by a dead process.
        store = JobStore(db)
        store.conn.execute("UPDATE items SET state = 'in_flight', content = NULL WHERE line IN (3, 7)")
        store.conn.execute("UPDATE jobs SET owner = ?, state = 'running'", (f"{socket.gethostname()}:999999999:dead",))
        store.close()
        sent = len(rec.seen)
        summary = await BatchRunner(client, db, "j").run()
    assert summary.done == 10 and summary.sent == 2
    assert sorted(rec.items()[sent:]) == ["it-0003", "it-0007"]


async def test_capacity_never_fails_an_item_it_is_parked_and_comes_back(tmp_path: Path) -> None:
    script = Script()
    outage = {"until": 60.0}

    def flaky(n: int, body: dict) -> Reply:
        return OVERLOADED if asyncio.get_running_loop().time() < outage["until"] else ok(body["model"])

    for m in ("flagship", "medium", "small"):
        script.set(m, flaky)
    db = tmp_path / "jobs.db"
    bus = EventBus(history=10000)
    progress = collect(bus, ev.BatchProgress)
    extra = "[client]\ndeadline = 10"
    async with client_for(build_app(script), extra=extra, bus=bus, cooldown=5, ramp_duration=1) as client:
        runner = BatchRunner(
            client,
            db,
            "j",
            RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 12), concurrency=4, park_base=5, park_cap=20),
        )
        summary = await runner.run()
    assert (summary.done, summary.failed) == (12, 0)
    assert max(p.parked for p in progress) > 0  # visible while it waited
    parks = rows(db, "SELECT item, kind, wait, decision FROM attempts WHERE decision = 'park'")
    assert parks and all(k == "capacity" and w >= 5 for _, k, w, _ in parks)
    per_item = dict(rows(db, "SELECT id, parks FROM items"))
    assert all(v >= 1 for v in per_item.values())
    # Attempt numbers go on across parks: no item restarts at 1.
    for item_id in per_item:
        numbers = [
            r[0]
            for r in rows(
                db,
                "SELECT attempt FROM attempts WHERE item = ? AND decision NOT IN ('park', 'skip') ORDER BY rowid",
                item_id,
            )
        ]
        assert numbers == list(range(1, len(numbers) + 1))


async def test_auth_halts_the_job_with_a_clear_error_and_resume_goes_on(tmp_path: Path) -> None:
    script = Script()
    refused = Reply(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
    state = {"bad": True}
    for m in ("flagship", "medium", "small"):
        script.set(m, lambda n, body: refused if state["bad"] else ok(body["model"]))
    db = tmp_path / "jobs.db"
    src = write_items(tmp_path / "in.jsonl", 30)
    async with client_for(build_app(script)) as client:
        with pytest.raises(BatchError, match="halted.*key, not capacity.*capmon batch resume j"):
            await BatchRunner(client, db, "j", RunnerOptions(input_path=src, concurrency=4)).run()
    states = dict(rows(db, "SELECT state, count(*) FROM items GROUP BY state"))
    assert states == {"pending": 30}  # nothing failed: it was the key, not the items
    assert read_progress(db, "j").state == "halted"
    state["bad"] = False
    async with client_for(build_app(script)) as client:  # a fresh client: the key was fixed
        summary = await BatchRunner(client, db, "j", RunnerOptions(concurrency=4)).run()
    assert summary.done == 30


async def test_quota_halts_the_job_too(tmp_path: Path) -> None:
    script = Script()
    spent = Reply(
        429,
        {
            "error": {
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "type": "insufficient_quota",
                "code": "insufficient_quota",
            }
        },
    )
    for m in ("flagship", "medium", "small"):
        script.always(m, spent)
    async with client_for(build_app(script)) as client:
        with pytest.raises(BatchError, match="billing, not capacity"):
            await BatchRunner(
                client, tmp_path / "db", "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 5))
            ).run()


async def test_a_bad_request_fails_only_that_item_with_kind_and_message(tmp_path: Path) -> None:
    script = Script()

    def reply(n: int, body: dict) -> Reply:
        if body["messages"][-1]["content"] == "it-0002":
            return Reply(
                400, {"error": {"message": "Invalid 'messages[0].content': too odd.", "code": "invalid_value"}}
            )
        return ok(body["model"])

    script.set("flagship", reply)
    db = tmp_path / "jobs.db"
    async with client_for(build_app(script)) as client:
        summary = await BatchRunner(
            client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 3))
        ).run()
    assert (summary.done, summary.failed, summary.ok) == (2, 1, False)
    [(state, kind, message)] = rows(db, "SELECT state, error_kind, error_message FROM items WHERE id = 'it-0002'")
    assert (state, kind) == ("failed", "bad_request") and "too odd" in message


async def test_pause_starts_nothing_new_and_resume_goes_on(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=1.0))
    async with client_for(rec) as client:
        runner = BatchRunner(
            client,
            tmp_path / "db",
            "j",
            RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 20), concurrency=2),
        )
        task = asyncio.create_task(runner.run())
        await asyncio.sleep(2.5)
        runner.pause()
        assert runner.paused
        await asyncio.sleep(1.0)  # the two in flight finish
        sent = len(rec.seen)
        assert runner.progress().state == "paused"
        await asyncio.sleep(120)
        assert len(rec.seen) == sent and runner.progress().in_flight == 0
        runner.resume()
        summary = await task
    assert summary.done == 20 and not runner.paused


async def test_a_window_waits_visibly_until_it_opens(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.01))
    clock = WallClock(local(2026, 3, 2, 21, 50))
    async with client_for(rec) as client:
        runner = BatchRunner(
            client,
            tmp_path / "db",
            "j",
            RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 5), window="22:00-06:00"),
            clock=clock,
        )
        task = asyncio.create_task(runner.run())
        await asyncio.sleep(300)
        p = runner.progress()
        assert rec.seen == [] and p.state == "waiting-window"
        assert p.opens_at == pytest.approx(local(2026, 3, 2, 22, 0))
        assert read_progress(tmp_path / "db", "j").state == "waiting-window"
        summary = await task
    first = rec.seen[0][0]
    assert 600 - 1 <= first <= 600 + 61  # within a step of 22:00
    assert summary.done == 5


async def test_a_window_that_wraps_midnight_closes_and_opens_again(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=1.0))
    clock = WallClock(local(2026, 3, 3, 0, 59, 55))  # five seconds before the window closes
    async with client_for(rec) as client:
        runner = BatchRunner(
            client,
            tmp_path / "db",
            "j",
            RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 20), concurrency=1, window="01:10-01:00"),
            clock=clock,
        )  # open all day but 01:00-01:10
        task = asyncio.create_task(runner.run())
        await asyncio.sleep(300)
        assert 4 <= len(rec.seen) <= 6 and runner.progress().state == "waiting-window"
        assert runner.progress().opens_at == pytest.approx(local(2026, 3, 3, 1, 10))
        summary = await task
    assert summary.done == 20
    assert rec.seen[6][0] >= 600 - 5  # the rest waited for 01:10


async def test_the_audit_records_every_attempt_with_the_key_alias_never_the_key(tmp_path: Path) -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    db = tmp_path / "jobs.db"
    async with client_for(build_app(script)) as client:
        await BatchRunner(
            client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 4), concurrency=1)
        ).run()
    audit = rows(
        db,
        "SELECT job, item, attempt, model, endpoint, key_alias, status, kind, decision, latency, at "
        "FROM attempts ORDER BY rowid",
    )
    raw = (
        (tmp_path / "jobs.db").read_bytes() + (tmp_path / "jobs.db-wal").read_bytes()
        if (tmp_path / "jobs.db-wal").exists()
        else (tmp_path / "jobs.db").read_bytes()
    )
    assert b"sk-test-aaaa" not in raw
    first = [r for r in audit if r[1] == "it-0001"]
    assert [(r[3], r[6], r[7], r[8]) for r in first] == [
        ("flagship", 503, "capacity", "fallback"),
        ("medium", 200, None, "ok"),
    ]
    assert all(r[0] == "j" and r[4] == "ep" and r[5] == "a" and r[9] is not None and r[10] > 1e9 for r in audit)


async def test_duplicate_ids_are_refused_before_anything_is_sent(tmp_path: Path) -> None:
    rec = Recorder(scenario_app())
    src = write_jsonl(tmp_path / "in.jsonl", [item("a"), item("b"), item("c"), item("a"), "", item("b")])
    async with client_for(rec) as client:
        with pytest.raises(BatchError, match=r"duplicate ids: 'a' on lines 1, 4; 'b' on lines 2, 6.*nothing was sent"):
            await BatchRunner(client, tmp_path / "db", "j", RunnerOptions(input_path=src)).run()
    assert rec.seen == []
    assert rows(tmp_path / "db", "SELECT count(*) FROM jobs") == [(0,)]  # fix the file and run again


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
async def test_an_empty_file_says_so(tmp_path: Path, text: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(text)
    async with client_for(scenario_app()) as client:
        with pytest.raises(BatchError, match="is empty"):
            await BatchRunner(client, tmp_path / "db", "j", RunnerOptions(input_path=src)).run()


async def test_bad_lines_fail_with_their_line_numbers_while_the_rest_run(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.01))
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            item(1),
            "{not json",
            json.dumps({"messages": [{"role": "user", "content": "no id"}]}),
            json.dumps({"id": "x", "messages": "hello"}),
            item(5, model="nope"),
            item(6, max_tokens=0),
        ],
    )
    db = tmp_path / "db"
    async with client_for(rec) as client:
        summary = await BatchRunner(client, db, "j", RunnerOptions(input_path=src)).run()
    assert (summary.done, summary.failed) == (2, 4)
    assert sorted(rec.items()) == ["it-0001", "no id"]
    failed = rows(db, "SELECT line, id, error_kind, error_message FROM items WHERE state = 'failed' ORDER BY line")
    assert [(r[0], r[1], r[2]) for r in failed] == [
        (2, "line-2", "bad_input"),
        (4, "x", "bad_input"),
        (5, "it-0005", "bad_input"),
        (6, "it-0006", "bad_input"),
    ]
    assert (
        "not valid JSON" in failed[0][3]
        and "messages" in failed[1][3]
        and "'nope' is not in the config" in failed[2][3]
    )
    assert rows(db, "SELECT id FROM items WHERE line = 3") == [("line-3",)]


async def test_an_existing_job_refuses_a_different_input(tmp_path: Path) -> None:
    db = tmp_path / "db"
    async with client_for(scenario_app(latency=0.01)) as client:
        await BatchRunner(client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "a.jsonl", 3))).run()
        with pytest.raises(BatchError, match="different file.*--job NAME.*capmon batch resume j"):
            await BatchRunner(client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "b.jsonl", 4))).run()


async def test_a_job_run_by_another_live_runner_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "db"
    src = write_items(tmp_path / "in.jsonl", 50)
    async with client_for(scenario_app(latency=1.0)) as client:
        first = asyncio.create_task(BatchRunner(client, db, "j", RunnerOptions(input_path=src, concurrency=2)).run())
        await asyncio.sleep(1.5)
        with pytest.raises(BatchError, match="being run by another process"):
            await BatchRunner(client, db, "j", RunnerOptions(input_path=src)).run()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first


async def test_an_ingest_cut_short_goes_on_from_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest_mod, "INGEST_CHUNK", 7)
    src = write_items(tmp_path / "in.jsonl", 30)
    db = tmp_path / "db"
    calls = {"n": 0}
    real = JobStore.ingest_chunk

    def dying(self: JobStore, *a: object, **kw: object) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # the process dies in the middle of reading the file
        real(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(JobStore, "ingest_chunk", dying)
    rec = Recorder(scenario_app(latency=0.01))
    async with client_for(rec) as client:
        with pytest.raises(KeyboardInterrupt):
            await BatchRunner(client, db, "j", RunnerOptions(input_path=src)).run()
        assert rows(db, "SELECT count(*), max(line) FROM items") == [(14, 14)]  # two chunks of seven, in one piece
        assert rec.seen == []
        summary = await BatchRunner(client, db, "j", RunnerOptions(input_path=src)).run()
    assert summary.total == 30 and summary.done == 30
    assert sorted(r[0] for r in rows(db, "SELECT line FROM items")) == list(range(1, 31))


async def test_read_progress_from_outside_matches_the_runner(tmp_path: Path) -> None:
    db = tmp_path / "db"
    async with client_for(scenario_app(latency=0.5)) as client:
        runner = BatchRunner(
            client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 40), concurrency=4)
        )
        task = asyncio.create_task(runner.run())
        await asyncio.sleep(2.2)
        inside, outside = runner.progress(), read_progress(db, "j")
        assert outside.state == "running" and outside.total == 40
        assert (outside.done, outside.failed) == (inside.done, inside.failed) and inside.done >= 12
        assert dict(outside.per_model) == dict(inside.per_model)
        await task
    final = read_progress(db, "j")
    assert (final.state, final.done, final.in_flight) == ("finished", 40, 0)


async def test_a_result_counts_as_done_only_once_committed(tmp_path: Path) -> None:
    db = tmp_path / "db"
    bus = EventBus(history=1000)
    seen: list[tuple[int, int]] = []

    def check(e: ev.Event) -> None:
        if isinstance(e, ev.BatchItemDone):
            committed = rows(db, "SELECT count(*) FROM items WHERE id = ? AND state = 'done'", e.item_id)[0][0]
            seen.append((committed, 1))

    bus.subscribe(check)
    async with client_for(scenario_app(latency=0.05), bus=bus) as client:
        runner = BatchRunner(
            client,
            db,
            "j",
            RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 30), concurrency=5, flush_interval=1.0),
        )
        await runner.run()
    assert len(seen) == 30 and all(c == 1 for c, _ in seen)
