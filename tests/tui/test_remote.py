"""The dashboard attached to a real gateway (``capmon --connect``): the simulator and
the gateway on free loopback ports in the test's loop, the real control API over real
HTTP, the real app driven by Pilot. Nothing of capmon's is faked."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
from textual.pilot import Pilot

from capmon.connect import GatewayAddress
from capmon.core.base.secrets import Secret
from capmon.core.control.breaker import State
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.config import Config
from capmon.gateway import GatewayServer, close_app, create_app, load_settings, start_server
from capmon.sim.server import start_simulator
from capmon.tui.app import CapmonApp
from capmon.tui.digest import EventDigester
from capmon.tui.remote import RemoteSource, attach, log_tail
from capmon.tui.screens import ConfirmScreen
from capmon.tui.source import ReadOnlyError
from tests.gateway.helpers import ENV, HELLO, config, scenario, spec
from tests.tui.conftest import SIZE
from tests.tui.screen_text import screen_text

ADMIN = "sk-gw-admin-remote-0123456789abcdef"
REFRESH = 0.1


@dataclass
class Gateway:
    """A gateway that a test can stop and start again on the same port, in front of one client."""

    client: FallbackClient
    cfg: Config
    env: dict[str, str]
    server: GatewayServer | None = None
    port: int = 0
    stops: list[Callable[[], None]] = field(default_factory=list)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = create_app(self.client, load_settings(self.cfg, listen="127.0.0.1:0", environ=self.env))
        self.server = await start_server(app, "127.0.0.1", self.port)
        self.port = self.server.port
        self.stops = [lambda: close_app(app)]

    async def stop(self) -> None:
        for fn in self.stops:
            fn()
        self.stops = []
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.origin, headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False, timeout=30
        )

    async def chat(self, model: str = "auto") -> str:
        async with self.http() as http:
            r = await http.post("/v1/chat/completions", json={"model": model, "messages": HELLO})
        assert r.status_code == 200, r.text
        return r.headers["x-capmon-model"]


@contextlib.asynccontextmanager
async def gateway(*, admin: bool = True) -> AsyncIterator[Gateway]:
    sim = await start_simulator(scenario(*(spec(m, base_latency=0.02) for m in ("flagship", "medium", "small"))))
    try:
        cfg = config(sim.base_url, gateway='admin_key_env = "GW_ADMIN"' if admin else "")
        env = {**ENV, "GW_ADMIN": ADMIN}
        async with FallbackClient(cfg, environ=env) as client:
            gw = Gateway(client, cfg, env)
            await gw.start()
            try:
                yield gw
            finally:
                await gw.stop()
    finally:
        await sim.stop()


def address(gw: Gateway, *, admin: bool = True) -> GatewayAddress:
    return GatewayAddress(origin=gw.origin, admin_key=Secret(ADMIN, "admin") if admin else None)


@contextlib.asynccontextmanager
async def dashboard(gw: Gateway, *, admin: bool = True) -> AsyncIterator[tuple[CapmonApp, Pilot, RemoteSource]]:
    where = address(gw, admin=admin)
    source = RemoteSource(where, await attach(where), refresh=REFRESH, retry_max=0.3)
    app = CapmonApp(source, refresh=REFRESH, drain_every=0.0)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(
            pilot,
            lambda: app.started and app.refreshes > 0 and "Quit" in footer(screen_text(app)),
            "the dashboard started",
        )
        yield app, pilot, source


async def until(pilot: Pilot, check: Callable[[], object], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds  # real time: the app, the gateway and the simulator share this loop
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds}s: {what}")
        await pilot.pause(0.05)


def row_states(app: CapmonApp) -> dict[str, str]:
    return {str(row.value): app.table.get_cell(row, "state").plain for row in app.table.rows}


def footer(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def log_text(app: CapmonApp) -> str:
    return "\n".join(strip.text for strip in app.log_view.lines)


async def test_the_dashboard_shows_the_gateways_targets_its_history_and_live_events() -> None:
    async with gateway() as gw:
        await gw.chat()
        async with gw.http() as http:  # before the dashboard attaches: history
            r = await http.post("/capmon/trip", json={"target": "small", "reason": "maintenance window"})
            assert r.status_code == 200
        async with dashboard(gw) as (app, pilot, source):
            assert [str(k.value) for k in app.table.rows] == [
                "flagship@sim/sim-key",
                "medium@sim/sim-key",
                "small@sim/sim-key",
            ]
            assert row_states(app)["small@sim/sim-key"] == "✋ open (manual)"
            text = screen_text(app)
            assert f"gateway 127.0.0.1:{gw.port}" in text and "1 ok" in text, text
            assert "READ-ONLY" not in text and "Trip" in footer(text)
            assert "small breaker closed → forced-open (maintenance window)" in log_text(app)
            assert not any(n.title == "Tripped by hand" for n in app._notifications)  # old news: the log only
            assert source.models == ["flagship", "medium", "small"]

            # Live: traffic sent to the gateway by someone else shows in the totals and the table.
            for _ in range(3):
                assert await gw.chat() == "flagship"
            await until(pilot, lambda: app.snap is not None and app.snap.succeeded == 4, "the new requests")
            await until(pilot, lambda: "4 ok" in screen_text(app), "the status bar's totals")
            assert app.snap is not None and app.snap.targets[0].window(60).requests == 4
            # ... and so do events: a pin through the control API by another client.
            async with gw.http() as http:
                assert (await http.post("/capmon/pin", json={"model": "medium"})).status_code == 200
            await until(pilot, lambda: "pinned medium" in log_text(app), "the pin in the event log")
            await until(pilot, lambda: "pinned medium (manual)" in screen_text(app), "the pin in the status bar")


async def test_a_trip_from_the_dashboard_takes_effect_on_the_gateway() -> None:
    async with gateway() as gw:
        async with dashboard(gw) as (app, pilot, source):
            await pilot.press("t")
            assert isinstance(app.screen, ConfirmScreen) and "Trip flagship?" in screen_text(app)
            await pilot.press("y")
            await until(pilot, lambda: gw.client.snapshot().targets[0].state == State.FORCED_OPEN, "the trip")
            assert await gw.chat() == "medium"  # the gateway's own clients fall back
            await until(pilot, lambda: row_states(app)["flagship@sim/sim-key"] == "✋ open (manual)", "the row")
            await until(pilot, lambda: "flagship breaker closed → forced-open" in log_text(app), "the log line")
            assert any(n.title == "Tripped by hand" for n in app._notifications)

            await pilot.press("r")
            await until(pilot, lambda: gw.client.snapshot().targets[0].state == State.CLOSED, "the reset")
            await until(pilot, lambda: row_states(app)["flagship@sim/sim-key"] == "● closed", "the row")
            assert await gw.chat() == "flagship"

            await pilot.press("down", "c", "y")  # force-close medium
            await until(pilot, lambda: gw.client.snapshot().targets[1].state == State.FORCED_CLOSED, "force-close")
            app.pin_model("small")
            await until(pilot, lambda: gw.client.pinned == "small", "the pin")
            assert await gw.chat() == "small"
            app.pin_model(None)
            await until(pilot, lambda: gw.client.pinned is None, "automatic routing")


async def test_without_the_admin_key_the_dashboard_is_read_only() -> None:
    async with gateway() as gw:
        async with dashboard(gw, admin=False) as (app, pilot, source):
            assert source.readonly
            text = screen_text(app)
            assert "READ-ONLY" in text and "Trip" not in footer(text)
            assert "read-only: no admin key (set CAPMON_ADMIN_KEY" in log_text(app)
            await pilot.press("t", "r", "c", "m")
            await pilot.pause()
            assert len(app.screen_stack) == 1
            app.request_trip("flagship@sim/sim-key", "flagship")
            await pilot.pause()
            assert any("Read-only dashboard: trip is not allowed" in n.message for n in app._notifications)
            try:
                source.trip("flagship")
            except ReadOnlyError:
                pass
            else:
                raise AssertionError("a read-only source sent a trip")
            await pilot.pause(0.3)
            assert gw.client.snapshot().targets[0].state == State.CLOSED  # nothing reached the gateway


async def test_a_trip_the_gateway_refuses_says_so() -> None:
    """The dashboard holds an admin key, but the gateway has none (it is read-only for all):
    the dashboard opens read-only and says why; a trip sent anyway is refused by the
    gateway and the dashboard says that too."""
    async with gateway(admin=False) as gw:
        async with dashboard(gw) as (app, pilot, source):
            assert source.readonly
            assert "the gateway has no admin key (gateway.admin_key_env" in log_text(app)
            source.readonly = False  # as a dashboard that believed it could act
            source.trip("flagship")
            await until(pilot, lambda: "trip flagship not done" in log_text(app), "the refusal")
            assert "the gateway refused: this gateway has no admin key" in log_text(app)
            assert any(n.severity == "error" and "not done" in n.message for n in app._notifications)
            assert gw.client.snapshot().targets[0].state == State.CLOSED


async def test_the_gateway_going_away_is_shown_retried_and_the_dashboard_comes_back() -> None:
    async with gateway() as gw:
        async with dashboard(gw) as (app, pilot, source):
            await gw.chat()
            async with gw.http() as http:
                assert (await http.post("/capmon/trip", json={"target": "medium"})).status_code == 200
            await until(pilot, lambda: app.snap is not None and app.snap.succeeded == 1, "the first request")
            await until(pilot, lambda: "medium breaker closed → forced-open" in log_text(app), "its events")
            port = gw.port

            await gw.stop()
            await until(pilot, lambda: source.down_since is not None, "the loss noticed")
            await until(pilot, lambda: "UNREACHABLE" in screen_text(app), "the status bar")
            assert "lost the gateway at" in log_text(app)
            assert any(n.severity == "error" and "lost the gateway" in n.message for n in app._notifications)
            assert app.snap is not None and app.snap.succeeded == 1  # the last snapshot stays
            assert len(app.table.rows) == 3
            app.pin_model("small")  # cannot be sent: said at once, nothing queued for later
            await pilot.pause()
            assert any("does not answer; not sent" in n.message for n in app._notifications)

            await gw.start()  # the same client behind a new gateway on the same port
            assert gw.port == port
            await until(pilot, lambda: source.down_since is None, "the gateway back")
            await until(pilot, lambda: "answers again" in log_text(app), "the return in the log")
            await until(pilot, lambda: "UNREACHABLE" not in screen_text(app), "the status bar back")
            for _ in range(2):
                await gw.chat()
            await until(pilot, lambda: app.snap is not None and app.snap.succeeded == 3, "new snapshots")
            # The event stream came back too, without showing again what it had shown.
            async with gw.http() as http:
                assert (await http.post("/capmon/reset", json={"target": "medium"})).status_code == 200
            await until(pilot, lambda: "medium breaker forced-open → closed" in log_text(app), "live events again")
            assert log_text(app).count("medium breaker closed → forced-open") == 1
            assert gw.client.pinned is None


def test_the_history_shown_on_attach_is_the_newest_that_the_log_writes_whole() -> None:
    trips = [
        ev.BreakerChanged(
            at=float(i),
            wall=1_767_225_600.0 + i,
            target=f"m{i}@sim/k",
            model=f"m{i}",
            old="closed",
            new="open",
            reason="3 capacity failures in a row",
            manual=False,
            cooldown_until=None,
        )
        for i in range(100)
    ]
    noise = [ev.RetryFired(at=0.0, wall=1_767_225_600.0, request_id=i) for i in range(50)]  # not logged
    shown = log_tail(noise + trips)
    assert shown == trips[-EventDigester().max_lines :]  # the newest lines, not the oldest
    # Fallbacks of one second and model pair are one line: all of them fit.
    burst = [
        ev.FellBack(
            at=0.0, wall=1_767_225_600.5, request_id=i, item_id=None, from_model="a", to_model="b", reason="at capacity"
        )
        for i in range(500)
    ]
    assert log_tail(burst) == burst and log_tail([]) == []
