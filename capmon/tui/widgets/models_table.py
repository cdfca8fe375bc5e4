"""The models table: one row per target, in preference order."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.coordinate import Coordinate
from textual.widgets import DataTable

from capmon.core.base import text
from capmon.core.providers.token_param import TokenParam
from capmon.core.types.snapshot import EngineSnapshot, TargetSnapshot
from capmon.tui import format as fmt


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
    right: bool = False


# Fixed widths: auto-sized columns would re-measure and jitter on every refresh.
COLUMNS: tuple[Column, ...] = (
    Column("model", "model", 19),
    Column("api", "api", 9),  # the endpoint's provider API: openai, anthropic, azure
    # The state with what is next for it (failures toward a trip, the next probe's countdown).
    Column("state", "breaker", 21),
    Column("slots", "in/lim", 6, right=True),
    Column("rps", "req/s", 5, right=True),
    Column("r429", "429/m", 5, right=True),
    Column("r503", "503/m", 5, right=True),
    Column("err", "err%", 4, right=True),
    Column("p50", "p50", 6, right=True),
    Column("p99", "p99", 6, right=True),
    Column("last", "last", 4, right=True),
    Column("probe", "probe", 6, right=True),
    Column("spark", "429+503, 2 min", 24),
    Column("key", "key", 10),
)


SPARK_FLOOR = 10
MODEL_WIDTH = COLUMNS[0].width - 2  # the pin mark takes two cells
# Rows whose deployments know the model by different ids widen the model column up to this
# (only when the rows change, so it never jitters); past it a name is clipped.
MAX_MODEL_WIDTH = 48
_MCT = "ᵐᶜᵗ"  # a model sent max_completion_tokens
_LACKS = " ⊘"  # its provider said it lacks a feature


def matches(t: TargetSnapshot, needle: str) -> bool:
    needle = needle.strip().lower()
    return not needle or any(needle in name.lower() for name in (t.model, t.target, t.deployment))


def _target_name(t: TargetSnapshot, snap: EngineSnapshot) -> str:
    """The row's name: the model, and which of its targets the row is when it has several
    (``@endpoint`` for one of its deployments, ``/key`` for one of an endpoint's keys), then
    the id that endpoint knows it by (``claude@vertex (claude-sonnet-4-5@20250929)``) where
    the model's deployments know it by different ids: one id everywhere is the model's own
    ``api_model``, the same on every row, and would only crowd the column."""
    mine = [o for o in snap.targets if o.model == t.model]
    endpoints = {o.endpoint for o in mine}
    name = t.model
    if len(endpoints) > 1:
        name += f"@{t.endpoint}"
    if sum(1 for o in mine if o.endpoint == t.endpoint) > 1:
        name += f"/{t.key_alias}"
    if t.deployment and t.deployment != t.model and len({o.deployment for o in mine}) > 1:
        name += f" ({t.deployment})"
    return name


def _mark(t: TargetSnapshot) -> str:
    # A model sent max_completion_tokens (configured or learned) is marked: it is a
    # wire quirk people meet when they move to reasoning models.
    # A deployment whose provider said it lacks a feature (tools, images...) is marked too:
    # requests that need it pass it over (the event log's line says which feature).
    mct = _MCT if t.token_param == TokenParam.MAX_COMPLETION_TOKENS else ""
    return mct + (_LACKS if t.lacks else "")


def _name_width(t: TargetSnapshot, snap: EngineSnapshot) -> int:
    return len(_target_name(t, snap)) + len(_mark(t))


def _right(cell: Text | str) -> Text:
    t = cell if isinstance(cell, Text) else Text(cell)
    t.justify = "right"
    return t


class ModelsTable(DataTable[Text]):
    """Rows keyed by target id; cells are updated in place, only when they change."""

    DEFAULT_CSS = """
    ModelsTable {
        height: auto;
        max-height: 16;
        border: round $primary 60%;
        border-title-color: $text;
        border-title-style: bold;
    }
    ModelsTable:focus {
        border: round $primary;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        # Renderable foreground on the cursor row: the selected row keeps its state colours.
        super().__init__(
            id=id,
            cursor_type="row",
            zebra_stripes=False,
            show_row_labels=False,
            cursor_foreground_priority="renderable",
        )
        self.border_title = "Models (preference order)"
        self._keys: list[str] = []
        self._cells: dict[tuple[str, str], str] = {}  # what each cell shows now, to skip no-op updates
        self._model_width = MODEL_WIDTH  # the model column's room for a name (its width but the pin mark)

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        for c in COLUMNS:
            width = self._model_width + 2 if c.key == "model" else c.width
            self.add_column(_right(c.label) if c.right else Text(c.label), key=c.key, width=width)

    @property
    def selected_target(self) -> str | None:
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(Coordinate(self.cursor_row, 0))
        return row_key.value

    def select_target(self, target: str) -> None:
        if target in self._keys:
            self.move_cursor(row=self._keys.index(target))

    def show(self, snap: EngineSnapshot, needle: str = "") -> None:
        rows = [t for t in snap.targets if matches(t, needle)]
        keys = [t.target for t in rows]
        if keys != self._keys:
            self._rebuild(snap, rows)
            return
        for t in rows:
            for key, value in self._row(t, snap).items():
                if self._cells.get((t.target, key)) != value.markup:
                    self._cells[(t.target, key)] = value.markup
                    self.update_cell(t.target, key, value)
        self.border_subtitle = self._subtitle(snap, len(rows))

    def _rebuild(self, snap: EngineSnapshot, rows: list[TargetSnapshot]) -> None:
        selected = self.selected_target
        width = max(MODEL_WIDTH, min(MAX_MODEL_WIDTH - 2, max((_name_width(t, snap) for t in rows), default=0)))
        if width != self._model_width:
            self._model_width = width
            self.clear(columns=True)
            self._add_columns()
        else:
            self.clear()
        self._cells.clear()
        self._keys = [t.target for t in rows]
        for t in rows:
            cells = self._row(t, snap)
            for key, value in cells.items():
                self._cells[(t.target, key)] = value.markup
            self.add_row(*cells.values(), key=t.target)
        if selected is not None:
            self.select_target(selected)
        self.border_subtitle = self._subtitle(snap, len(rows))

    @staticmethod
    def _subtitle(snap: EngineSnapshot, shown: int) -> str:
        """The rows the filter hides, and what each model's answers cost so far (once one had a price)."""
        hidden = len(snap.targets) - shown
        said = [f"{hidden} hidden by the filter"] if hidden else []
        priced = [s for s in snap.spend if s.answers > s.unpriced]
        if priced:
            said.append("spent: " + " · ".join(f"{s.model} {text.usd(s.cost)}" for s in priced))
        return "  │  ".join(said)

    @staticmethod
    def _label(t: TargetSnapshot, snap: EngineSnapshot, width: int = MODEL_WIDTH) -> Text:
        """The row's name within ``width`` cells (the pin mark's two aside)."""
        name = _target_name(t, snap)
        mark = _mark(t)
        name = text.clip(name, width - len(mark))
        if t.pinned_by(snap.pinned):
            return Text(f"▸ {name}{mark}", style="bold reverse")
        return Text.assemble(f"  {name}", (mark, "dim"))

    def _row(self, t: TargetSnapshot, snap: EngineSnapshot) -> dict[str, Text]:
        now = snap.now
        w10 = t.window(10)
        w60 = t.window(60)
        # One scale for all rows so they compare by eye; a floor so that one stray 429
        # does not draw a full bar.
        top = max(SPARK_FLOOR, max((max(o.spark, default=0) for o in snap.targets), default=0))
        return {
            "model": self._label(t, snap, self._model_width),
            "api": fmt.api_text(t.api),
            "state": fmt.breaker_cell(t, now),
            # While ramping, the ramp's own ceiling is what admits requests.
            "slots": _right(f"{t.in_flight}/{t.ramp_slots if t.ramp_slots is not None else round(t.limit)}"),
            "rps": _right(f"{w10.per_second:.1f}"),
            "r429": _right(fmt.count(w60.per_minute(w60.rate_limited))),
            "r503": _right(fmt.count(w60.per_minute(w60.capacity), warn="red")),
            "err": _right(fmt.error_share(w60.error_share)),
            "p50": _right(fmt.latency(w60.p50)),
            "p99": _right(fmt.latency(w60.p99)),
            "last": _right(fmt.last_status(t)),
            "probe": _right(fmt.latency(t.probe_latency)),
            "spark": fmt.spark(t.spark, top),
            "key": fmt.key_text(t, now),
        }
