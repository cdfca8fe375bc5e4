"""The dashboard's traffic worker: what sends real requests through the client.

Three kinds: the generated demo job (the default on the simulator), a JSONL job
(``capmon --job INPUT.jsonl``), or a job another process runs (``capmon --attach
JOB``: progress read from the job database, read-only). All of them look the same
to the batch panel: ``progress()``, ``pause()`` / ``resume()``, ``run()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from capmon.core.base.clock import Clock, default_clock
from capmon.core.types.events import BatchProgress, Notice

if TYPE_CHECKING:
    from capmon.batch.store import Db

# (client, db_path, job, *, input_path, concurrency) -> an object with BatchRunner's API.
RunnerFactory = Callable[..., Any]

DEMO_CONCURRENCY = 24  # enough to fill the demo's flagship and spill over, so fallbacks show
JOB_CONCURRENCY = 16  # `capmon batch run`'s default
DEMO_PAUSE_BETWEEN_ROUNDS = 5.0  # seconds a finished demo round stays on screen
ATTACH_POLL = 1.0  # seconds between reads of an attached job's progress


class Traffic(Protocol):
    name: str
    runs: bool  # False: nothing to run (probes only)
    can_pause: bool

    @property
    def paused(self) -> bool: ...
    def progress(self) -> BatchProgress | None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    async def run(self) -> Any: ...


def _default_factory() -> RunnerFactory:
    from capmon.batch import BatchRunner
    from capmon.batch.options import RunnerOptions

    def make(client: Any, db: Path, job: str, *, input_path: Path, concurrency: int) -> Any:
        return BatchRunner(client, db, job, RunnerOptions(input_path=input_path, concurrency=concurrency))

    return make


class NoTraffic:
    """No traffic worker: ``--no-traffic``."""

    runs = False
    can_pause = False
    paused = False

    def __init__(self, why: str) -> None:
        self.name = why

    def progress(self) -> BatchProgress | None:
        return None

    def pause(self) -> None:
        raise RuntimeError("no batch to pause")

    def resume(self) -> None:
        raise RuntimeError("no batch to resume")

    async def run(self) -> None:
        return None


class RunnerTraffic:
    """Runs batch jobs in this process through the shared client.

    ``repeat``: the demo starts a fresh round when one finishes, so the dashboard
    stays alive for as long as someone watches it.
    """

    can_pause = True
    runs = True

    def __init__(
        self,
        name: str,
        make_runner: Callable[[int], Any],
        *,
        repeat: bool = False,
        client: Any = None,
        clock: Clock | None = None,
        announce: Callable[[int], str] | None = None,
    ) -> None:
        self.name = name
        self._make_runner = make_runner
        self._announce = announce
        self._repeat = repeat
        self._client = client
        self._clock = clock or (client.clock if client is not None else default_clock())
        self.runner: Any = None
        self._want_paused = False
        self.rounds = 0

    @classmethod
    def demo(cls, client: Any, workdir: Path, items: int, factory: RunnerFactory | None = None) -> RunnerTraffic:
        from capmon.batch import write_demo_input

        make = factory or _default_factory()

        def make_runner(round_: int) -> Any:
            job = "demo" if round_ == 1 else f"demo-{round_}"
            path = write_demo_input(workdir / f"{job}.jsonl", items, seed=round_ - 1)
            return make(client, workdir / "demo.db", job, input_path=path, concurrency=DEMO_CONCURRENCY)

        def announce(round_: int) -> str:
            models = len(getattr(client, "targets", ())) or "the"
            return (
                f"demo round {round_}: {items:,} generated items through {models} targets, "
                f"{DEMO_CONCURRENCY} at a time (a throw-away job, not in your job list)"
            )

        return cls("demo job", make_runner, repeat=True, client=client, announce=announce)

    @classmethod
    def for_job(
        cls, client: Any, input_path: Path, db_path: Db | None = None, factory: RunnerFactory | None = None
    ) -> RunnerTraffic:
        from capmon.batch.store import locate

        make = factory or _default_factory()
        db = db_path or locate()
        job = input_path.stem  # the name `capmon batch run` would give it

        def make_runner(round_: int) -> Any:
            return make(client, db, job, input_path=input_path, concurrency=JOB_CONCURRENCY)

        return cls(
            f"job {job}", make_runner, client=client, announce=lambda _: f"job {job}: running {input_path.name} ({db})"
        )

    @property
    def paused(self) -> bool:
        return self.runner.paused if self.runner is not None else self._want_paused

    def progress(self) -> BatchProgress | None:
        return self.runner.progress() if self.runner is not None else None

    def pause(self) -> None:
        self._want_paused = True
        if self.runner is not None:
            self.runner.pause()

    def resume(self) -> None:
        self._want_paused = False
        if self.runner is not None:
            self.runner.resume()

    async def run(self) -> Any:
        while True:
            self.rounds += 1
            if self.rounds > 1:
                # The finished round stays on screen a moment before the next replaces it.
                await self._clock.sleep(DEMO_PAUSE_BETWEEN_ROUNDS)
            self.runner = self._make_runner(self.rounds)
            if self._want_paused:
                self.runner.pause()
            if self._announce is not None:
                self._notice(self._announce(self.rounds))
            summary = await self.runner.run()
            if not self._repeat:
                return summary

    def _notice(self, message: str) -> None:
        if self._client is not None:
            self._client.bus.publish(
                Notice(at=self._clock.now(), wall=self._clock.wall(), level="info", message=message)
            )


class AttachedJob:
    """A job run by `capmon batch run` in another process: its progress, read-only."""

    can_pause = False
    runs = True
    paused = False

    def __init__(
        self,
        job: str,
        db_path: Db | None = None,
        *,
        clock: Clock | None = None,
        reader: Callable[[Db, str], BatchProgress] | None = None,
    ) -> None:
        self.job = job
        self.name = f"attached job {job}"
        self._db_path = db_path
        self._clock = clock or default_clock()
        self._reader = reader
        self._last: BatchProgress | None = None

    def progress(self) -> BatchProgress | None:
        return self._last

    def pause(self) -> None:
        raise RuntimeError(f"job {self.job} runs in another process: pause it there")

    def resume(self) -> None:
        raise RuntimeError(f"job {self.job} runs in another process: resume it there")

    async def run(self) -> None:
        from capmon.batch.store import locate, read_progress

        reader = self._reader or read_progress
        db = self._db_path or locate()
        while True:
            # Store reads block: keep them off the loop that draws the screen.
            self._last = await asyncio.to_thread(reader, db, self.job)
            await self._clock.sleep(ATTACH_POLL)
