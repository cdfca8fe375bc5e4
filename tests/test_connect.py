"""The control API's client (capmon/connect.py) against a real gateway on the simulator:
addresses, keys, the event stream and its filter, refused actions."""

from __future__ import annotations

import contextlib

import pytest

from capmon.connect import (
    ConnectOptions,
    GatewayAddress,
    GatewayClient,
    GatewayError,
    KeyRefused,
    parse_origin,
    resolve,
)
from capmon.core.base.exceptions import CapmonError
from capmon.core.base.secrets import Secret
from capmon.core.control.breaker import State
from capmon.core.types import events as ev
from tests.gateway.helpers import HELLO, running

ADMIN = "sk-gw-admin-connect-0123456789abcdef"


@pytest.mark.parametrize(
    "typed, origin",
    [
        ("http://127.0.0.1:4000", "http://127.0.0.1:4000"),
        ("http://127.0.0.1:4000/", "http://127.0.0.1:4000"),
        ("http://127.0.0.1:4000/v1", "http://127.0.0.1:4000"),  # the base URL `capmon serve` prints
        ("127.0.0.1:4000", "http://127.0.0.1:4000"),
        ("https://gw.example:8443", "https://gw.example:8443"),
        ("http://[::1]:4000", "http://[::1]:4000"),
    ],
)
def test_addresses(typed: str, origin: str) -> None:
    assert parse_origin(typed) == origin


@pytest.mark.parametrize("typed", ["ftp://x:1", "http://", "http://h:99999", "http://h:1/capmon", "http://h:1/?a=b"])
def test_addresses_that_are_not_a_gateways(typed: str) -> None:
    with pytest.raises(CapmonError, match="^--connect: expected"):
        parse_origin(typed)


def test_keys_come_from_the_environment_and_never_show() -> None:
    env = {"CAPMON_ADMIN_KEY": ADMIN, "MINE": "sk-client-connect-abcdef0123456789"}
    address = resolve(ConnectOptions("127.0.0.1:4000", key_env="MINE", environ=env))
    assert address.admin_key is not None and address.admin_key.reveal() == ADMIN
    assert address.key is not None and address.read_key is address.admin_key  # the admin key reads too
    assert ADMIN not in repr(address) and "sk-client" not in repr(address)
    assert resolve(ConnectOptions("127.0.0.1:4000", environ={})).read_key is None  # the defaults may be unset
    with pytest.raises(CapmonError, match="^--admin-key-env: environment variable NOPE is not set$"):
        resolve(ConnectOptions("127.0.0.1:4000", admin_key_env="NOPE", environ={}))
    with pytest.raises(CapmonError, match="^--key-env: expected an environment variable name"):
        resolve(ConnectOptions("127.0.0.1:4000", key_env="not a name", environ={}))


async def test_the_event_stream_decodes_only_what_is_asked_and_resumes() -> None:
    async with running(gateway='admin_key_env = "GW_ADMIN"', environ={"GW_ADMIN": ADMIN}) as gw, gw.http() as http:
        for _ in range(2):
            r = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO})
            assert r.status_code == 200
        address = GatewayAddress(gw.origin, admin_key=Secret(ADMIN, "admin"))
        async with GatewayClient(address) as client:
            info = await client.info()
            done = await client.act("/capmon/trip", {"target": "small"})
            assert [t["state"] for t in done["targets"]] == [State.FORCED_OPEN] and info.readonly is False
            assert (await client.snapshot()).targets[2].state == State.FORCED_OPEN
            got: list[tuple[int, ev.Event | None]] = []
            async with contextlib.aclosing(client.events(None, (ev.BreakerChanged,))) as stream:
                async for item in stream:
                    got.append(item)
                    if isinstance(item[1], ev.BreakerChanged):
                        break
            numbers = [seq for seq, _ in got]
            assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) > 2  # every event numbered
            decoded = [e for _, e in got if e is not None]
            assert len(decoded) == 1 and isinstance(decoded[0], ev.BreakerChanged) and decoded[0].model == "small"
            # Resumed after the trip: the next event is the reset, nothing before it again.
            assert (
                await http.post("/capmon/reset", json={"target": "small"}, headers={"authorization": f"Bearer {ADMIN}"})
            ).status_code == 200
            async with contextlib.aclosing(client.events(numbers[-1])) as stream:
                seq, event = await anext(stream)
            assert seq == numbers[-1] + 1 and isinstance(event, ev.BreakerChanged) and event.new == "closed"


async def test_refused_actions_and_unknown_targets_say_why() -> None:
    async with running() as gw:  # a gateway without an admin key: read-only for everyone
        async with GatewayClient(GatewayAddress(gw.origin, admin_key=Secret(ADMIN, "admin"))) as client:
            with pytest.raises(KeyRefused, match="the gateway refused: this gateway has no admin key"):
                await client.act("/capmon/trip", {"target": "flagship"})
        async with GatewayClient(GatewayAddress(gw.origin)) as client:
            with pytest.raises(KeyRefused, match="no admin key: set CAPMON_ADMIN_KEY"):
                await client.act("/capmon/trip", {"target": "flagship"})
    async with running(gateway='admin_key_env = "GW_ADMIN"', environ={"GW_ADMIN": ADMIN}) as gw:
        async with GatewayClient(GatewayAddress(gw.origin, admin_key=Secret(ADMIN, "admin"))) as client:
            with pytest.raises(GatewayError, match=r"/capmon/trip answered 404: .*gpt-9"):
                await client.act("/capmon/trip", {"target": "gpt-9"})
        async with GatewayClient(GatewayAddress(gw.sim.base_url.removesuffix("/v1"))) as client:
            with pytest.raises(GatewayError, match="answered 404: not a capmon gateway"):
                await client.info()
