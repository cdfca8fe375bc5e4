"""Where the dashboard's data comes from.

The app never talks to the engine directly: it reads a :class:`DashboardSource`
(snapshots on a timer, events from the bus) and sends manual actions back through
it. The live source wraps a real engine (config, simulator, client, probe and
traffic workers); tests and screenshots inject a fake one with scripted snapshots
and a manual clock (memray's live TUI is built the same way).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from capmon.core.base.clock import Clock, default_clock
from capmon.core.base.exceptions import CapmonError
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import Config
from capmon.core.types.events import BatchProgress, EventBus, Notice
from capmon.core.types.snapshot import EngineSnapshot
from capmon.probe import ProbeWorker
from capmon.runtime import Engine, open_engine
from capmon.tui.traffic import AttachedJob, NoTraffic, RunnerFactory, RunnerTraffic, Traffic


class ReadOnlyError(CapmonError):
    """A manual action was asked of a read-only dashboard."""


@dataclass(frozen=True)
class WorkerSpec:
    """One long-running job the app runs as a Textual worker."""

    name: str  # shown in toasts and the log when the worker fails
    group: str  # a Textual worker group; one worker per group (exclusive)
    run: Callable[[], Awaitable[Any]]


@runtime_checkable
class DashboardSource(Protocol):
    bus: EventBus
    clock: Clock
    readonly: bool
    models: list[str]
    description: str  # one line for the status bar: what this dashboard is watching

    async def start(self) -> None: ...
    def workers(self) -> Sequence[WorkerSpec]: ...
    async def stop(self) -> None: ...

    def snapshot(self) -> EngineSnapshot: ...
    def batch(self) -> BatchProgress | None: ...

    @property
    def batch_paused(self) -> bool: ...
    @property
    def can_pause_batch(self) -> bool: ...

    def pin(self, model: str | None) -> None: ...
    def trip(self, target: str) -> None: ...
    def reset(self, target: str) -> None: ...
    def force_close(self, target: str) -> None: ...
    def pause_batch(self) -> None: ...
    def resume_batch(self) -> None: ...


def refuse_if_readonly(method: Callable[..., Any]) -> Callable[..., Any]:
    """Manual actions raise ReadOnlyError on a read-only source, whatever the UI did."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.readonly:
            raise ReadOnlyError(f"read-only dashboard: {method.__name__.replace('_', ' ')} is not allowed")
        return method(self, *args, **kwargs)

    return wrapper


class LiveSource:
    """The real thing: an engine from :func:`open_engine`, probe workers per target
    and one traffic worker (the demo job, a JSONL job, or an attached job)."""

    def __init__(
        self,
        config: Config,
        *,
        readonly: bool = False,
        job_input: str | Path | None = None,
        attach: str | None = None,
        traffic: bool = True,
        db_path: Path | None = None,
        environ: Mapping[str, str] | None = None,
        runner_factory: RunnerFactory | None = None,
    ) -> None:
        if job_input is not None and attach is not None:
            raise CapmonError(
                f"a dashboard runs a job file or shows an attached job, not both "
                f"(job file {job_input}, attached job {attach})"
            )
        self.config = config
        # Attached to a job in another process: its breakers and its client live there,
        # so trip / reset / pin here would only steer this dashboard's probes. Off.
        self.readonly = readonly or attach is not None
        self.clock: Clock = default_clock()
        self.bus = EventBus()
        self.models = [m.name for m in config.models]
        self._job_input = Path(job_input) if job_input is not None else None
        self._attach = attach
        self._traffic_enabled = traffic
        self._db_path = db_path
        self._environ = environ
        self._runner_factory = runner_factory
        self._stack: contextlib.AsyncExitStack | None = None
        self.engine: Engine | None = None
        self.probes: ProbeWorker | None = None
        self.traffic: Traffic = NoTraffic("starting")
        self.description = self._describe()

    def _describe(self) -> str:
        where = f"simulator {self.config.simulator.scenario}" if self.config.simulator.enabled else self.config.path
        if self._attach:
            return f"{where} · attached to job {self._attach}"
        if self._job_input:
            return f"{where} · job {self._job_input.name}"
        if not self._traffic_enabled:
            return f"{where} · probes only"
        return f"{where} · demo job"

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        stack = contextlib.AsyncExitStack()
        try:
            self.engine = await stack.enter_async_context(
                open_engine(self.config, environ=self._environ, bus=self.bus, role="dashboard")
            )
            client = self.engine.client
            self.clock = client.clock
            self.probes = ProbeWorker(client, self.config.dashboard.probe_interval)
            if self._attach is not None:
                self.traffic = AttachedJob(self._attach, self._db_path)
                self.bus.publish(
                    Notice(
                        at=self.clock.now(),
                        wall=self.clock.wall(),
                        level="info",
                        message=(
                            f"attached to job {self._attach}: its progress comes from the job database; "
                            f"the models table shows this dashboard's own probes "
                            f"(the job's client runs in its own process)"
                        ),
                    )
                )
            elif not self._traffic_enabled:
                self.traffic = NoTraffic("--no-traffic: probes only")
            elif self._job_input is not None:
                self.traffic = RunnerTraffic.for_job(client, self._job_input, self._db_path, self._runner_factory)
            else:
                tmp = Path(stack.enter_context(_temp_dir()))
                self.traffic = RunnerTraffic.demo(client, tmp, self.config.dashboard.demo_items, self._runner_factory)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack

    def workers(self) -> list[WorkerSpec]:
        specs: list[WorkerSpec] = []
        if self.probes is not None:
            offsets = self.probes.offsets()
            for tid in self.probes.target_ids:
                run = functools.partial(self.probes.run_target, tid, offset=offsets[tid])
                specs.append(WorkerSpec(f"probe {tid}", f"probe:{tid}", run))
        if self.traffic.runs:
            specs.append(WorkerSpec(self.traffic.name, "traffic", self.traffic.run))
        return specs

    async def stop(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    # ------------------------------------------------------------ reading

    @property
    def client(self) -> FallbackClient:
        if self.engine is None:
            raise CapmonError("the engine has not started")
        return self.engine.client

    def snapshot(self) -> EngineSnapshot:
        return self.client.snapshot()

    def batch(self) -> BatchProgress | None:
        return self.traffic.progress()

    @property
    def batch_paused(self) -> bool:
        return self.traffic.paused

    @property
    def can_pause_batch(self) -> bool:
        return self.traffic.can_pause

    # ------------------------------------------------------------ manual actions

    @refuse_if_readonly
    def pin(self, model: str | None) -> None:
        self.client.pin(model)

    @refuse_if_readonly
    def trip(self, target: str) -> None:
        self.client.trip(target)

    @refuse_if_readonly
    def reset(self, target: str) -> None:
        self.client.reset(target)

    @refuse_if_readonly
    def force_close(self, target: str) -> None:
        self.client.force_close(target)

    @refuse_if_readonly
    def pause_batch(self) -> None:
        self.traffic.pause()

    @refuse_if_readonly
    def resume_batch(self) -> None:
        self.traffic.resume()


@contextlib.contextmanager
def _temp_dir() -> Any:
    import tempfile

    # The demo job lives in its own throw-away database, never in the user's job list.
    with tempfile.TemporaryDirectory(prefix="capmon-demo-") as d:
        yield d
