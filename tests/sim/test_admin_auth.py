"""Who may use /admin (a reported security bug: `capmon sim --listen 0.0.0.0:PORT` served
/admin to anyone). Beyond loopback the simulator needs an admin key or an explicit
--open-admin; a configured key is checked (Bearer or x-admin-key), also on loopback.

No test listens beyond loopback: the refusals happen before binding, and the runs that
would bind use 192.0.2.1 (TEST-NET-1, on no interface here), where binding fails at once."""

from __future__ import annotations

import httpx
import pytest

from capmon.cli import main
from capmon.core.base.exceptions import SimulatorError
from tests.sim.helpers import AUTH, chat_body, fast_scenario
from tests.support.simulated import StartSim

ADMIN_KEY = "adm-0123456789abcdef0123"
UNREACHABLE = "192.0.2.1"


async def test_a_configured_key_guards_admin_on_loopback(start_sim: StartSim, http: httpx.AsyncClient) -> None:
    sim = await start_sim(fast_scenario(), admin_key=ADMIN_KEY)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-admin-key": ADMIN_KEY[:-1]}, AUTH):
        r = await http.get(f"{sim.admin_url}/stats", headers=headers)
        assert r.status_code == 401, headers
        assert ADMIN_KEY not in r.text
    r = await http.post(f"{sim.admin_url}/models/sim-a", json={"slots": 0})
    assert r.status_code == 401
    assert (await http.post(f"{sim.base_url}/chat/completions", json=chat_body(), headers=AUTH)).status_code == 200
    ok = await http.get(f"{sim.admin_url}/stats", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert ok.status_code == 200 and ok.json()["totals"]["completed"] == 1
    ok = await http.post(f"{sim.admin_url}/faults", json={"mode": "off"}, headers={"x-admin-key": ADMIN_KEY})
    assert ok.status_code == 200
    index = (await http.get(sim.origin)).text
    assert "requires the admin key" in index and "/v1/responses" in index and ADMIN_KEY not in index


async def test_loopback_without_a_key_is_as_before_and_says_so(start_sim: StartSim, http: httpx.AsyncClient) -> None:
    sim = await start_sim(fast_scenario())
    assert (await http.get(f"{sim.admin_url}/stats")).status_code == 200
    index = (await http.get(sim.origin)).text
    assert "needs no key: this server listens on loopback only" in index


def test_the_policy() -> None:
    from capmon.sim.admin import AdminAccess, admin_policy

    assert admin_policy("127.0.0.1", None).access is AdminAccess.LOOPBACK
    assert admin_policy("::1", None).access is AdminAccess.LOOPBACK
    assert admin_policy("localhost", None).access is AdminAccess.LOOPBACK
    assert admin_policy("127.0.0.1", "k").access is AdminAccess.KEY
    assert admin_policy("0.0.0.0", "k").access is AdminAccess.KEY
    assert admin_policy("0.0.0.0", None, open_admin=True).access is AdminAccess.OPEN
    for host in ("0.0.0.0", "::", "10.1.2.3", "myhost"):
        with pytest.raises(SimulatorError, match="needs an admin key"):
            admin_policy(host, None)
    assert ADMIN_KEY not in repr(admin_policy("0.0.0.0", ADMIN_KEY))  # the key never shows


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["sim", *args])
    return code, capsys.readouterr().err


def test_capmon_sim_refuses_a_public_address_without_a_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CAPMON_SIM_ADMIN_KEY", raising=False)
    code, err = run_cli(capsys, "--listen", f"{UNREACHABLE}:8089")
    assert code == 2
    assert "needs an admin key" in err and "CAPMON_SIM_ADMIN_KEY" in err and "--open-admin" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_capmon_sim_with_a_key_warns_and_never_prints_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_SIM_ADMIN", ADMIN_KEY)
    code, err = run_cli(capsys, "--listen", f"{UNREACHABLE}:8089", "--admin-key-env", "MY_SIM_ADMIN")
    assert "WARNING" in err and "reachable from other machines" in err and "$MY_SIM_ADMIN" in err
    assert ADMIN_KEY not in err
    assert code == 2 and "cannot listen" in err  # it went on to bind, which fails only because of the address


def test_capmon_sim_open_admin_warns(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAPMON_SIM_ADMIN_KEY", raising=False)
    code, err = run_cli(capsys, "--listen", f"{UNREACHABLE}:8089", "--open-admin")
    assert "WARNING" in err and "--open-admin: anyone who can reach" in err
    assert code == 2 and "cannot listen" in err


def test_a_named_key_variable_must_be_set(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    code, err = run_cli(capsys, "--listen", "127.0.0.1:0", "--admin-key-env", "NOT_SET_ANYWHERE")
    assert code == 2 and "environment variable NOT_SET_ANYWHERE is not set" in err


async def test_an_embedded_simulator_beyond_loopback_needs_the_key_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from capmon.sim.server import embedded_admin_key, start_simulator

    with pytest.raises(SimulatorError, match="needs an admin key"):
        await start_simulator(fast_scenario(), host="0.0.0.0")  # refused before anything is bound
    monkeypatch.setenv("CAPMON_SIM_ADMIN_KEY", ADMIN_KEY)
    assert embedded_admin_key("0.0.0.0") == ADMIN_KEY
    assert embedded_admin_key("127.0.0.1") is None  # loopback stays as it was
