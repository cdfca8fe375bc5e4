"""Defaults a batch job shares with the command line and the dashboard.

A module of constants only, importable without the rest of the batch layer, so
``capmon.cli`` and ``capmon.tui`` can read them without a cycle or a cost.
"""

from __future__ import annotations

DEFAULT_CONCURRENCY = 16  # items in flight at once, when neither the command nor the job says
DEFAULT_LEASE_TTL = 30.0  # seconds a shared store's item lease lasts unless its worker renews it
