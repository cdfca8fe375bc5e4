"""`capmon batch compare JOB --sample N`: how much the fallbacks changed a job's answers.

It sends a seeded random sample of the items a fallback model served to the model each
item counted on first (its preferred one: ``items.first_model``, else the model it asked
for), pinned there (``Request.fallback = False``: that model or no answer) and at batch
priority, so the job's own traffic and interactive requests go first. The answers are kept
beside the originals (the store's ``comparisons`` table), exported with each item, and
summed up by ``capmon report``.

Agreement: two answers of at most :data:`SHORT_WORDS` words each (labels) agree when they
are equal once stripped and case-folded; longer ones when the word-level
``difflib.SequenceMatcher`` ratio is at least :data:`SIMILAR`. A comparison that got no
answer is counted as neither.
"""

from __future__ import annotations

import asyncio
import difflib
import random
from collections.abc import Mapping
from dataclasses import dataclass

from capmon.batch.client import BatchClient
from capmon.batch.items import request_of
from capmon.batch.sqlite import Comparison, FallbackItem
from capmon.batch.states import JobState
from capmon.batch.store import Db, Store, open_store
from capmon.core.base.exceptions import BatchError, RequestFailed
from capmon.core.types.result import Priority, Request

SHORT_WORDS = 3  # answers this short are labels: compared exactly
SIMILAR = 0.8  # a longer answer agrees at this word-level similarity or more
COMPARE_DEADLINE = 120.0  # seconds one comparison waits for its model before giving up
CONCURRENCY = 4  # comparisons in flight at once: a sample, not a second job


def agrees(a: str | None, b: str | None) -> bool | None:
    """Whether two answers agree (None: one of them is missing)."""
    if a is None or b is None:
        return None
    wa, wb = a.strip().casefold().split(), b.strip().casefold().split()
    if len(wa) <= SHORT_WORDS and len(wb) <= SHORT_WORDS:
        return wa == wb
    return difflib.SequenceMatcher(None, wa, wb, autojunk=False).ratio() >= SIMILAR


@dataclass(frozen=True)
class Agreement:
    """A job's comparisons summed up: ``compared`` answered both ways, ``agreed`` of them agree."""

    compared: int
    agreed: int
    missing: int  # comparisons that got no answer

    @property
    def rate(self) -> float | None:
        return self.agreed / self.compared if self.compared else None

    def as_dict(self) -> dict[str, object]:
        return {"compared": self.compared, "agreed": self.agreed, "missing": self.missing, "rate": self.rate}


def agreement(originals: Mapping[int, str | None], comparisons: Mapping[int, Comparison]) -> Agreement:
    """``originals``: each compared item's answer, by item key."""
    compared = agreed = missing = 0
    for key, c in comparisons.items():
        same = agrees(originals.get(key), c.content)
        if same is None:
            missing += 1
            continue
        compared += 1
        agreed += same
    return Agreement(compared, agreed, missing)


def job_agreement(store: Store, job_id: int) -> tuple[Agreement | None, dict[str, Agreement]]:
    """The job's agreement over every comparison, and by the fallback model that served the
    items ({}: none compared, or a store without comparisons)."""
    comparisons = store.comparisons(job_id)
    if not comparisons:
        return None, {}
    items = {i.key: i for i in store.fallback_items(job_id) if i.key in comparisons}
    originals = {k: i.content for k, i in items.items()}
    by_model: dict[str, dict[int, Comparison]] = {}
    for key, c in comparisons.items():
        if key in items:
            by_model.setdefault(items[key].model, {})[key] = c
    return agreement(originals, comparisons), {m: agreement(originals, cs) for m, cs in sorted(by_model.items())}


def sample(items: list[FallbackItem], n: int, seed: int) -> list[FallbackItem]:
    """``n`` of ``items`` (all when fewer), the same ones for the same seed, in input order."""
    if n >= len(items):
        return list(items)
    return sorted(random.Random(seed).sample(items, n), key=lambda i: i.key)


def request_for(item: FallbackItem, preferred: str, job: str) -> Request:
    """The item pinned to its preferred model, at batch priority (never ahead of the work)."""
    return request_of(
        item, model=preferred, job=job, priority=Priority.BATCH, deadline=COMPARE_DEADLINE, fallback=False
    )


# A job whose runner may be sending its own items now.
_BUSY = frozenset({JobState.STARTING, JobState.INGESTING, JobState.RUNNING, JobState.WAITING_WINDOW})


async def compare_job(client: BatchClient, db: Db, job: str, n: int, seed: int) -> Agreement:
    """Send the sample, save each answer as it comes, and return the job's agreement."""
    store = open_store(db)
    try:
        info = store.require(job)
        state = store.state_of(info)
        if state in _BUSY:
            # its own work first: a comparison is asked for after the job, never beside it
            raise BatchError(
                f"job {job!r} is {state.value}: compare it once it has finished, stopped or been paused"
                " (the job's own items go first)"
            )
        chosen = sample(store.fallback_items(info.id), n, seed)
        default = next(iter(client.model_names()), None)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(item: FallbackItem) -> None:
            preferred = item.preferred or default
            if preferred is None or preferred == item.model:
                return  # nothing to compare it with
            async with gate:
                try:
                    result = await client.chat(request_for(item, preferred, job))
                    content, error = result.content, None
                except RequestFailed as e:
                    content, error = None, str(e)
            now = client.clock.wall()
            store.save_comparison(info.id, item.key, model=preferred, content=content, error=error, now=now)

        await asyncio.gather(*(one(i) for i in chosen))
        return job_agreement(store, info.id)[0] or Agreement(0, 0, 0)
    finally:
        store.close()
