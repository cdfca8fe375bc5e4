"""The dashboard's widgets: each renders one part of a snapshot and owns its CSS."""

from capmon.tui.widgets.backoff_panel import BackoffPanel
from capmon.tui.widgets.batch_panel import BatchPanel
from capmon.tui.widgets.event_log import EventLog
from capmon.tui.widgets.filter_bar import FilterBar
from capmon.tui.widgets.fleet_panel import FleetPanel
from capmon.tui.widgets.models_table import ModelsTable
from capmon.tui.widgets.status_bar import StatusBar

__all__ = ["BackoffPanel", "BatchPanel", "EventLog", "FilterBar", "FleetPanel", "ModelsTable", "StatusBar"]
