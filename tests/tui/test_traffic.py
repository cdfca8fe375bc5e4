"""Traffic workers with stand-in runners: pause before start, demo rounds, attach."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from capmon.core.types.events import EventBus, Notice
from capmon.tui.traffic import AttachedJob, NoTraffic, RunnerTraffic
from tests.support.clocks import ManualClock
from tests.tui.fakes import progress


class StubRunner:
    """BatchRunner's API, finishing as soon as it runs."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.paused = False
        self.ran = False

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def progress(self) -> Any:
        return progress(
            ManualClock(), job=self.job, done=1 if self.ran else 0, state="finished" if self.ran else "running"
        )

    async def run(self) -> str:
        self.ran = True
        return f"summary {self.job}"


class StubClient:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.bus = EventBus()
        self.targets = [object(), object(), object()]


async def test_a_pause_asked_before_the_runner_exists_is_applied_when_it_starts() -> None:
    runners: list[StubRunner] = []
    traffic = RunnerTraffic("job x", lambda r: runners.append(StubRunner(f"x{r}")) or runners[-1])
    assert traffic.progress() is None and not traffic.paused
    traffic.pause()
    assert traffic.paused
    assert await traffic.run() == "summary x1"
    assert runners[0].paused
    traffic.resume()
    assert not runners[0].paused and traffic.progress().done == 1  # type: ignore[union-attr]


async def test_the_demo_starts_a_new_round_when_one_finishes(tmp_path: Path) -> None:
    made: list[tuple[str, Path, int]] = []

    def factory(client: Any, db: Path, job: str, *, input_path: Path, concurrency: int) -> StubRunner:
        made.append((job, db, concurrency))
        assert input_path.is_file()
        return StubRunner(job)

    client = StubClient()
    notices: list[str] = []
    client.bus.subscribe(lambda e: notices.append(e.message) if isinstance(e, Notice) else None)
    traffic = RunnerTraffic.demo(client, tmp_path, 5, factory)
    task = asyncio.create_task(traffic.run())
    for _ in range(50):
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [m[0] for m in made[:3]] == ["demo", "demo-2", "demo-3"]
    assert {m[1] for m in made} == {tmp_path / "demo.db"} and made[0][2] == 24
    assert notices[0].startswith("demo round 1: 5 generated items through 3 targets")


async def test_an_attached_job_is_read_not_run(tmp_path: Path) -> None:
    seen: list[tuple[Path, str]] = []

    def reader(db: Path, job: str) -> Any:
        seen.append((db, job))
        return progress(ManualClock(), job=job, done=7)

    clock = ManualClock()
    attached = AttachedJob("nightly", tmp_path / "jobs.db", clock=clock, reader=reader)
    assert not attached.can_pause and attached.progress() is None
    task = asyncio.create_task(attached.run())
    for _ in range(20):
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert seen[0] == (tmp_path / "jobs.db", "nightly") and len(seen) > 1
    assert attached.progress().done == 7  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="another process"):
        attached.pause()


def test_no_traffic_runs_nothing() -> None:
    traffic = NoTraffic("--no-traffic: probes only")
    assert not traffic.runs and traffic.progress() is None and not traffic.can_pause
