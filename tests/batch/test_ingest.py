"""The ingest alone, on real files and a real job database: a new job read chunk by
chunk, the refusals that delete it again, the checks of an existing job's input, and
the remap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capmon.batch import ingest as ingest_mod
from capmon.batch.ingest import Ingest, Refused
from capmon.batch.options import OptionError
from capmon.batch.sqlite import JobStore
from capmon.batch.states import BatchKind, ItemState, JobState
from capmon.core.base.clock import LoopClock
from capmon.core.base.exceptions import BatchError
from tests.batch.helpers import item, rows, write_items, write_jsonl

pytestmark = pytest.mark.looptime
MODELS = ["flagship", "medium", "small"]


def _ingest(store: JobStore, src: Path | None, notes: list[str] | None = None, **kw: object) -> Ingest:
    return Ingest(
        store,
        "j",
        src,
        models=kw.pop("models", MODELS),
        clock=LoopClock(),  # type: ignore[arg-type]
        note=(notes if notes is not None else []).append,
        **kw,
    )  # type: ignore[arg-type]


async def _new_job(tmp_path: Path, src: Path) -> tuple[JobStore, Ingest]:
    store = JobStore(tmp_path / "jobs.db")
    ingest = _ingest(store, src)
    await ingest.read(ingest.create({"concurrency": 4}))
    return store, ingest


async def test_a_new_job_is_read_a_chunk_at_a_time_bad_lines_failing_on_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest_mod, "INGEST_CHUNK", 4)
    src = write_jsonl(tmp_path / "in.jsonl", [item(i) for i in range(1, 10)] + ["{oops", item(11, model="gone")])
    store = JobStore(tmp_path / "jobs.db")
    ingest = _ingest(store, src)
    info = ingest.create({"concurrency": 4})
    assert info.state is JobState.INGESTING and info.settings == {"concurrency": 4}
    totals: list[int] = []
    info = await ingest.read(info, totals.append)
    assert totals == [4, 8] and (info.state, info.total) == (JobState.READY, 11)
    assert rows(tmp_path / "jobs.db", "SELECT state, count(*) FROM items GROUP BY state") == [
        ("failed", 2),
        ("pending", 9),
    ]
    failed = rows(tmp_path / "jobs.db", "SELECT line, error_kind, error_message FROM items WHERE state = 'failed'")
    assert [(line, kind) for line, kind, _ in failed] == [(10, BatchKind.BAD_INPUT), (11, BatchKind.BAD_INPUT)]
    assert "'gone' is not in the config" in failed[1][2]


@pytest.mark.parametrize(
    "lines, expected",
    [
        ([], "is empty"),
        ([item("a"), item("b"), item("a")], "duplicate ids: 'a' on lines 1, 3"),
    ],
    ids=["empty", "duplicates"],
)
async def test_a_refused_input_deletes_its_job_again(tmp_path: Path, lines: list, expected: str) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    store = JobStore(tmp_path / "jobs.db")
    ingest = _ingest(store, src)
    info = ingest.create({})
    with pytest.raises(Refused, match=expected):
        await ingest.read(info)
    assert store.job("j") is None and rows(tmp_path / "jobs.db", "SELECT count(*) FROM items") == [(0,)]


async def test_a_file_that_is_not_the_one_fingerprinted_is_refused_as_changed_while_read(tmp_path: Path) -> None:
    src = write_items(tmp_path / "in.jsonl", 5)
    store = JobStore(tmp_path / "jobs.db")
    ingest = _ingest(store, src)
    info = ingest.create({})
    write_items(src, 6)  # written between the fingerprint and the read
    with pytest.raises(Refused, match="changed while job 'j' was being read"):
        await ingest.read(info)
    assert store.job("j") is None


def test_a_new_job_needs_a_readable_text_file(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    with pytest.raises(BatchError, match="no job named 'j'.*capmon batch run INPUT.jsonl --job j"):
        _ingest(store, None).create({})
    with pytest.raises(BatchError, match="no such file"):
        _ingest(store, tmp_path / "missing.jsonl").create({})
    (tmp_path / "in.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00rest")
    with pytest.raises(BatchError, match="gzip-compressed"):
        _ingest(store, tmp_path / "in.jsonl.gz").create({})
    assert store.jobs() == []


async def test_an_existing_job_takes_only_its_own_file_unless_told_to_take_the_new_one(tmp_path: Path) -> None:
    src = write_items(tmp_path / "in.jsonl", 20)
    store, _ = await _new_job(tmp_path, src)
    info = store.require("j")
    assert _ingest(store, src).check(info) == info  # the same file: nothing to do
    assert _ingest(store, None).check(info) == info  # a resume checks the job's own file
    lines = src.read_text().splitlines()
    lines[6] = json.dumps(item("edited"))
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(BatchError, match=r"changed since job 'j' was created: line 7 differs.*--accept-changed-input"):
        _ingest(store, src).check(info)
    notes: list[str] = []
    taken = _ingest(store, src, notes, accept_changed_input=True).check(info)
    assert taken.total == 20 and "taken as asked: 1 added, 1 removed, 0 edited" in notes[0]
    assert rows(tmp_path / "jobs.db", "SELECT state FROM items WHERE id = 'it-0007'") == [(ItemState.REMOVED,)]


async def test_the_remap_is_checked_remembered_and_required_for_models_gone(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [item(1, model="small"), item(2)])
    store, _ = await _new_job(tmp_path, src)
    info = store.require("j")
    lost = _ingest(store, src, models=["flagship", "medium"])
    with pytest.raises(BatchError, match=r"1 name 'small' \(first on line 1\).*--remap small=MODEL"):
        lost.remap(info, {})
    with pytest.raises(OptionError) as e:
        lost.remap(info, {"small": "tiny"})
    assert (e.value.option, e.value.value) == ("remap", "small=tiny") and "no model named 'tiny'" in e.value.detail
    assert lost.remap(info, {"small": "medium"}) == {"small": "medium"}
    store.set_job(info.id, settings={"remap": {"small": "medium"}})
    assert lost.remap(store.require("j"), {}) == {"small": "medium"}  # remembered from the run that asked
    assert _ingest(store, src).remap(info, {}) == {}  # the model is back: nothing to say
