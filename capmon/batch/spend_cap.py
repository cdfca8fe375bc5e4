"""A job's spend against its cap (``capmon batch run --max-cost USD``): the runner counts
each answer's cost (capmon/core/types/prices.py) and, once the spend reaches the cap,
starts nothing more; the items in flight finish and their answers are kept, and the job
ends paused until ``capmon batch resume JOB --max-cost USD`` raises the cap."""

from __future__ import annotations

import math

from capmon.batch.options import OptionError


def check_max_cost(value: float | None) -> float | None:
    """``--max-cost`` as given: a positive, finite number of USD (None: no cap)."""
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise OptionError("max_cost", "expected a positive amount of USD such as 5 or 0.25", value=f"{value:g}")
    return value


class SpendCap:
    """What a job has spent (its earlier runs' answers too) against its cap."""

    def __init__(self, cap: float | None, spent: float = 0.0) -> None:
        self.cap = check_max_cost(cap)
        self.spent = spent
        self.reached = False

    def add(self, cost: float | None) -> bool:
        """Count one answer's cost (None: it has no price); True the first time the spend
        reaches the cap (an answer without a price counts nothing toward it)."""
        if cost is not None:
            self.spent += cost
        if self.cap is None or self.reached or self.spent < self.cap:
            return False
        self.reached = True
        return True
