"""What the runner does with each way a request can end, with a stub client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from capmon.batch import BatchRunner, write_demo_input
from capmon.batch.items import Item, parse_line
from capmon.batch.options import RunnerOptions
from capmon.core.base.clock import LoopClock
from capmon.core.base.exceptions import BatchError, DeadlineExceeded, RequestFailed
from capmon.core.types.events import EventBus
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Attempt, ChatResult, Request
from tests.batch.helpers import config, rows, write_items

pytestmark = pytest.mark.looptime


class StubClient:
    """Fails each item's first request with ``error``, answers the next ones."""

    def __init__(self, error: RequestFailed | None) -> None:
        self.config = config()
        self.clock = LoopClock()
        self.bus = EventBus()
        self.error = error
        self.calls: dict[str, int] = {}
        self.observers: list[Any] = []

    def model_names(self) -> list[str]:
        return ["flagship", "medium", "small"]

    def add_observer(self, fn: Any) -> Any:
        self.observers.append(fn)
        return lambda: self.observers.remove(fn)

    async def chat(self, request: Request) -> ChatResult:
        n = self.calls[request.item_id or ""] = self.calls.get(request.item_id or "", 0) + 1
        await asyncio.sleep(0.01)
        attempt = Attempt(
            number=1,
            model="flagship",
            target="t",
            endpoint="ep",
            key_alias="a",
            started=self.clock.wall(),
            status=200,
            kind=None,
            reason="",
            hint=None,
            wait=0.0,
            latency=0.01,
            decision="ok",
        )
        if n == 1 and self.error is not None:
            raise self.error
        for fn in self.observers:
            fn(request, attempt)
        return ChatResult(
            model="flagship",
            endpoint="ep",
            target="t",
            content="ok",
            response={},
            attempts=(attempt,),
            latency=0.01,
            usage={"prompt_tokens": 3, "completion_tokens": 2},
        )


def failed(kind: Kind, cls: type[RequestFailed] = RequestFailed, hint: float | None = None) -> RequestFailed:
    attempt = Attempt(
        number=1,
        model="flagship",
        target="t",
        endpoint="ep",
        key_alias="a",
        started=0.0,
        status=503,
        kind=kind,
        reason="r",
        hint=hint,
        wait=0.0,
        latency=0.1,
        decision="fail",
    )
    return cls(Failure(kind, f"{kind.value} happened", 503, retry_after=hint), [attempt])


@pytest.mark.parametrize(
    "error",
    [
        failed(Kind.CAPACITY),
        failed(Kind.RATE_LIMITED),
        failed(Kind.TRANSIENT),
        failed(Kind.BAD_REQUEST, DeadlineExceeded),  # a deadline always parks, whatever came last
    ],
    ids=["capacity", "rate_limited", "transient", "deadline"],
)
async def test_not_now_kinds_park_the_item_and_it_comes_back(tmp_path: Path, error: RequestFailed) -> None:
    client = StubClient(error)
    runner = BatchRunner(
        client, tmp_path / "db", "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 3), park_base=7.0)
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    summary = await runner.run()
    assert (summary.done, summary.failed) == (3, 0)
    assert loop.time() - t0 >= 7.0  # it waited out the park
    assert rows(tmp_path / "db", "SELECT parks, attempts FROM items") == [(1, 2)] * 3
    assert len(rows(tmp_path / "db", "SELECT * FROM attempts WHERE decision = 'park'")) == 3


async def test_a_server_hint_longer_than_the_park_delay_wins(tmp_path: Path) -> None:
    runner = BatchRunner(
        StubClient(failed(Kind.RATE_LIMITED, hint=60.0)),
        tmp_path / "db",
        "j",
        RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 1), park_base=1.0),
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await runner.run()
    assert loop.time() - t0 >= 60.0


@pytest.mark.parametrize("kind", [Kind.BAD_REQUEST, Kind.TOO_LARGE])
async def test_item_kinds_fail_the_item(tmp_path: Path, kind: Kind) -> None:
    summary = await BatchRunner(
        StubClient(failed(kind)), tmp_path / "db", "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 2))
    ).run()
    assert (summary.done, summary.failed) == (0, 2)
    assert rows(tmp_path / "db", "SELECT DISTINCT error_kind FROM items") == [(kind.value,)]


@pytest.mark.parametrize("kind", [Kind.AUTH, Kind.QUOTA])
async def test_key_kinds_halt_the_job(tmp_path: Path, kind: Kind) -> None:
    with pytest.raises(BatchError, match="halted"):
        await BatchRunner(
            StubClient(failed(kind)),
            tmp_path / "db",
            "j",
            RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 5), concurrency=2),
        ).run()
    assert rows(tmp_path / "db", "SELECT DISTINCT state FROM items") == [("pending",)]


async def test_progress_before_and_after_a_run(tmp_path: Path) -> None:
    runner = BatchRunner(
        StubClient(None), tmp_path / "db", "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 4))
    )
    before = runner.progress()
    assert (before.state, before.total, before.done) == ("starting", None, 0)
    await runner.run()
    after = runner.progress()
    assert (after.state, after.total, after.done, after.pending, after.in_flight) == ("finished", 4, 4, 0, 0)
    assert after.per_model == (("flagship", 4),)


async def test_resume_without_an_input_needs_an_existing_job(tmp_path: Path) -> None:
    with pytest.raises(BatchError, match="no job named 'ghost'.*capmon batch run INPUT.jsonl --job ghost"):
        await BatchRunner(StubClient(None), tmp_path / "db", "ghost").run()


def test_bad_settings_are_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(BatchError, match="^concurrency: "):
        BatchRunner(StubClient(None), tmp_path / "db", "j", RunnerOptions(concurrency=0))
    with pytest.raises(BatchError, match="^window: "):
        BatchRunner(StubClient(None), tmp_path / "db", "j", RunnerOptions(window="soon"))
    with pytest.raises(BatchError, match="^rate: "):
        BatchRunner(StubClient(None), tmp_path / "db", "j", RunnerOptions(rate=-1))


def test_the_demo_input_is_valid_deterministic_and_realistic(tmp_path: Path) -> None:
    a = write_demo_input(tmp_path / "a.jsonl", 200, seed=3)
    b = write_demo_input(tmp_path / "b.jsonl", 200, seed=3)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != write_demo_input(tmp_path / "c.jsonl", 200, seed=4).read_bytes()
    items = [
        parse_line(i, line, ["flagship", "medium", "small"]) for i, line in enumerate(a.read_bytes().splitlines(), 1)
    ]
    assert len(items) == 200 and all(isinstance(it, Item) for it in items)
    assert len({it.id for it in items}) == 200 and items[0].id == "demo-00001"  # type: ignore[union-attr]
    assert len({it.messages_json for it in items}) > 150  # varied prompts
