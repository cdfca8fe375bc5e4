"""The states a job and its items are in, and the failure kinds of the batch layer's own.

str enums: they are written to SQLite and JSON as their values and compare equal to
them, so the stored and printed forms are what they always were ("done",
"waiting-window"). :class:`JobState` lives in capmon/core/types/states.py, since the core's
``BatchProgress.state`` carries it; the dashboard's batch panel reads it there.
"""

from __future__ import annotations

import enum

from capmon.core.types.states import JobState as JobState  # in the core: BatchProgress carries it


class ItemState(enum.StrEnum):
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    DONE = "done"
    FAILED = "failed"
    PARKED = "parked"  # capacity ran out: it comes back after a delay
    REMOVED = "removed"  # its line left the input (taken with --accept-changed-input): kept, never sent again

    @property
    def finished(self) -> bool:
        return self in (ItemState.DONE, ItemState.FAILED)


UNFINISHED = (ItemState.PENDING, ItemState.IN_FLIGHT, ItemState.PARKED)


class BatchKind(enum.StrEnum):
    """Failure kinds of the batch layer, beside the client's :class:`capmon.core.types.failure.Kind`
    (an answer over ``client.max_response_bytes`` is the client's ``Kind.OVERSIZED``)."""

    BAD_INPUT = "bad_input"  # the line itself was unusable, so nothing was ever sent for it
    INTERNAL = "internal"  # the client raised something it should not have: a bug, kept visible
    ERROR = "error"  # the client raised a CapmonError that is not a RequestFailed
