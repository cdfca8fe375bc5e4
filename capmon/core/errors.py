"""Classify a failed attempt from its status, body, error code and headers.

``classify_response`` and ``classify_exception`` never raise: a garbage header or a
body that is not JSON is still classified. See DESIGN.md for the table of kinds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(str, enum.Enum):
    CAPACITY = "capacity"
    RATE_LIMITED = "rate_limited"
    QUOTA = "quota"
    AUTH = "auth"
    TOO_LARGE = "too_large"
    BAD_REQUEST = "bad_request"
    TRANSIENT = "transient"


@dataclass(frozen=True, slots=True)
class Failure:
    kind: Kind
    reason: str
    status: int | None = None
    code: str | None = None
    retry_after: float | None = None  # seconds, from a server hint; None when there was none

    @property
    def retryable(self) -> bool:
        return self.kind in (Kind.CAPACITY, Kind.RATE_LIMITED, Kind.TRANSIENT)
