"""A runner's options, errors in a job's options, and the one option parsed from text pairs.

An option's error names the option and its value, never a command-line flag: the CLI
adds its flag when it reports one (``concurrency: ...`` is shown as
``--concurrency: ...``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from capmon.batch.defaults import DEFAULT_CONCURRENCY
from capmon.core.base.exceptions import BatchError

if TYPE_CHECKING:  # pacing reads this module's OptionError
    from capmon.batch.pacing import Window


class OptionError(BatchError):
    """A value given for one of a job's options is wrong. ``option`` names it as the
    option fields do (``concurrency``, ``rate``, ``window``, ``remap``, ``out``);
    ``value`` is the value when the message shows it; ``detail`` says what was expected."""

    def __init__(self, option: str, detail: str, *, value: str | None = None) -> None:
        self.option = option
        self.value = value
        self.detail = detail
        super().__init__(f"{option}{'' if value is None else ' ' + value}: {detail}")


def parse_remap(pairs: Iterable[str]) -> dict[str, str]:
    """``OLD=NEW`` pairs -> {OLD: NEW}: items naming model OLD (gone from the config) go to NEW."""
    out: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new:
            raise OptionError(
                "remap", "expected OLD=NEW, a model the job's items name and one in the config", value=pair
            )
        if old in out and out[old] != new:
            raise OptionError("remap", f"given twice ({out[old]} and {new})", value=old)
        out[old] = new
    return out


@dataclass(frozen=True, kw_only=True)
class RunnerOptions:
    """How a :class:`~capmon.batch.runner.BatchRunner` runs its job (the pacing is checked by
    :meth:`capmon.batch.pacing.Pacing.of` when the runner is made)."""

    input_path: Path | None = None  # the job's input; None: the job's own (a resume)
    concurrency: int = DEFAULT_CONCURRENCY
    rate: float | None = None  # items started per second, at most
    window: Window | str | None = None  # HH:MM-HH:MM, local time
    accept_changed_input: bool = False
    remap: Mapping[str, str] = field(default_factory=dict)  # OLD model -> NEW
    flush_interval: float = 0.1  # seconds a batch of results gathers before its commit
    flush_rows: int = 500  # outcomes that make a commit at once
    progress_interval: float = 0.5  # seconds between progress events
    park_base: float = 5.0  # the first park's delay, doubling up to park_cap
    park_cap: float = 300.0
    rng: random.Random | None = field(default=None, compare=False)  # the parks' jitter
    write_give_up: float | None = None  # seconds of failing saves before halting; None: the store's default
    lease_ttl: float | None = None  # a shared store's item lease; None: its default
    # Send each item as a stream, so that an answer that breaks mid-way is continued rather than
    # sent again from its start (capmon/core/routing/continuation.py; with [client] continuations).
    stream: bool = False
    # USD the job may spend at the config's prices, its earlier runs included; reached, it ends
    # paused (capmon/batch/spend_cap.py). None: no cap.
    max_cost: float | None = None
