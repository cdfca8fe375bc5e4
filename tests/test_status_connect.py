"""`capmon status --connect URL [--json]` and the start of `capmon --connect URL`, as a
person runs them: the real command line in another process, against a gateway on a free
loopback port in front of the simulator. Wrong addresses and refused keys are one line
and exit code 2; no key ever appears in what capmon prints."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import pytest

from capmon.cli import main
from capmon.connect import ConnectOptions, KeyRefused
from capmon.status import format_snapshot
from capmon.tui.remote import RemoteDashboardOptions, run_remote_dashboard
from tests.gateway.helpers import HELLO, running

ADMIN = "sk-gw-admin-status-0123456789abcdef"
CLIENT = "sk-gw-client-status-0123456789abcdef"
CANARY = "sk-canary-wrong-key-5f3e9a0c7d21b4e8"
KEYED = 'keys = [{ env = "GW_CLIENT", alias = "team" }]\nadmin_key_env = "GW_ADMIN"'
KEYS = {"GW_CLIENT": CLIENT, "GW_ADMIN": ADMIN}


@dataclass
class Run:
    code: int
    out: str
    err: str


async def capmon(*args: str, env: Mapping[str, str] | None = None) -> Run:
    """The command line in a child process (this loop keeps serving the gateway meanwhile)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CAPMON_")} | dict(env or {})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys; from capmon.cli import main; sys.exit(main())",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environ,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


async def cli(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *args: str,
    env: Mapping[str, str] | None = None,
) -> Run:
    """The same command line in this process (in a thread: it runs its own event loop)."""
    with monkeypatch.context() as m:
        for k in [k for k in os.environ if k.startswith("CAPMON_")]:
            m.delenv(k)
        for k, v in (env or {}).items():
            m.setenv(k, v)
        capsys.readouterr()
        code = await asyncio.to_thread(main, list(args))
        out, err = capsys.readouterr()
    return Run(code, out, err)


async def _chat_and_trip(http: httpx.AsyncClient, key: str = ADMIN) -> None:
    headers = {"authorization": f"Bearer {key}"}
    for _ in range(2):
        r = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO}, headers=headers)
        assert r.status_code == 200, r.text
    r = await http.post("/capmon/trip", json={"target": "medium", "reason": "by the test"}, headers=headers)
    assert r.status_code == 200, r.text


async def test_status_connect_prints_the_gateways_table() -> None:
    async with running(gateway='admin_key_env = "GW_ADMIN"', environ=KEYS) as gw, gw.http() as http:
        await _chat_and_trip(http)
        run = await capmon("status", "--connect", gw.origin)
        local = gw.client.snapshot()
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert lines[0].split()[:4] == ["model", "api", "target", "state"]
    rows = {line.split()[0]: line for line in lines[1:4]}
    assert set(rows) == {"flagship", "medium", "small"}
    assert "forced-open [manual]" in rows["medium"] and "closed" in rows["flagship"]
    assert "requests: 2 (2 ok, 0 failed, 0 cancelled, 0 in progress)" in run.out
    # The same table `capmon status` prints for a local client, from the gateway's own snapshot.
    assert run.out.splitlines()[0] == format_snapshot(local).splitlines()[0]
    assert run.err == ""


async def test_status_connect_json_is_the_snapshot_capmon_status_prints() -> None:
    async with running(gateway=KEYED, environ=KEYS) as gw, gw.http(CLIENT) as http:
        await _chat_and_trip(http, ADMIN)
        run = await capmon("status", "--connect", gw.base_url, "--json", env={"CAPMON_GATEWAY_KEY": CLIENT})
        local = json.loads(json.dumps(gw.client.snapshot().to_dict(), default=str))
    assert run.code == 0, run.err
    got = json.loads(run.out)
    assert set(got) == set(local)
    assert [set(t) for t in got["targets"]] == [set(t) for t in local["targets"]]
    assert [t["state"] for t in got["targets"]] == ["closed", "forced-open", "closed"]
    assert (got["requests"], got["succeeded"], got["failed"]) == (2, 2, 0)
    assert got["targets"][0]["windows"][1] == local["targets"][0]["windows"][1]  # the 60 s window, as served
    assert CLIENT not in run.out and ADMIN not in run.out


async def test_the_dashboard_command_prints_the_status_when_not_on_a_terminal() -> None:
    async with running() as gw, gw.http() as http:
        await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO})
        run = await capmon("--connect", gw.origin)
    assert run.code == 0, run.err
    assert "requests: 1 (1 ok, 0 failed, 0 cancelled, 0 in progress)" in run.out


async def test_wrong_addresses_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running() as gw:
        nothing = await capmon("status", "--connect", "http://127.0.0.1:9")  # the discard port: nothing listens
        not_gateway = await cli(capsys, monkeypatch, "status", "--connect", gw.sim.base_url.removesuffix("/v1"))
        bad = await cli(capsys, monkeypatch, "status", "--connect", "ftp://somewhere")
        path = await cli(capsys, monkeypatch, "status", "--connect", f"{gw.origin}/capmon/snapshot")
        creds = await cli(capsys, monkeypatch, "status", "--connect", f"http://user:{CANARY}@127.0.0.1:4000")
        probe = await cli(capsys, monkeypatch, "status", "--connect", gw.origin, "--probe")
        job = await cli(capsys, monkeypatch, "--connect", gw.origin, "--job", "items.jsonl")
        stray = await cli(capsys, monkeypatch, "status", "--key-env", "X")
    expected = {
        "nothing": (nothing, "cannot reach the gateway at http://127.0.0.1:9: no connection"),
        "not_gateway": (not_gateway, "answered 404: not a capmon gateway"),
        "bad": (bad, "--connect: expected http://HOST:PORT, got 'ftp://somewhere'"),
        "path": (path, "--connect: expected the gateway's address"),
        "creds": (creds, "--connect: the address holds credentials"),
        "probe": (probe, "--probe does not go with --connect"),
        "job": (job, "--job cannot go with --connect"),
        "stray": (stray, "--key-env goes with --connect URL"),
    }
    for name, (run, words) in expected.items():
        assert run.code == 2, (name, run)
        assert run.err.startswith("capmon: ") and words in run.err and run.err.count("\n") == 1, (name, run.err)
        assert "Traceback" not in run.err and run.out == "", (name, run)
    assert CANARY not in creds.err


async def test_refused_keys_are_one_line_and_exit_2_and_never_shown(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(gateway=KEYED, environ=KEYS) as gw:
        wrong = await capmon("status", "--connect", gw.origin, env={"CAPMON_GATEWAY_KEY": CANARY})
        none = await cli(capsys, monkeypatch, "status", "--connect", gw.origin)
        wrong_admin = await cli(capsys, monkeypatch, "status", "--connect", gw.origin, env={"CAPMON_ADMIN_KEY": CANARY})
        unset = await cli(capsys, monkeypatch, "status", "--connect", gw.origin, "--key-env", "NO_SUCH_VARIABLE_HERE")
        named = await cli(
            capsys, monkeypatch, "status", "--connect", gw.origin, "--key-env", "TEAM_KEY", env={"TEAM_KEY": CLIENT}
        )
        admin = await cli(capsys, monkeypatch, "status", "--connect", gw.origin, env={"CAPMON_ADMIN_KEY": ADMIN})
    assert none.code == 2 and "needs a key (401" in none.err and "set CAPMON_GATEWAY_KEY" in none.err, none
    assert wrong.code == 2 and "refused the client key in $CAPMON_GATEWAY_KEY (401" in wrong.err, wrong
    assert wrong_admin.code == 2 and "refused the admin key in $CAPMON_ADMIN_KEY (401" in wrong_admin.err
    assert unset.code == 2 and "--key-env: environment variable NO_SUCH_VARIABLE_HERE is not set" in unset.err
    for run in (none, wrong, wrong_admin, unset):
        assert run.err.count("\n") == 1 and "Traceback" not in run.err and run.out == "", run
        assert CANARY not in run.err + run.out and CLIENT not in run.err + run.out
    assert named.code == 0 and "flagship" in named.out, named
    assert admin.code == 0 and "flagship" in admin.out, admin


@pytest.mark.parametrize("gateway_keys", ["keyed", "open"])
async def test_the_dashboard_refuses_a_wrong_admin_key_before_its_screen_opens(gateway_keys: str) -> None:
    # An open gateway takes any key for reads: a wrong admin key shows only in what it says
    # this caller may do. Both are refused before anything is drawn.
    setup = KEYED if gateway_keys == "keyed" else 'admin_key_env = "GW_ADMIN"'
    async with running(gateway=setup, environ=KEYS) as gw:
        options = RemoteDashboardOptions(ConnectOptions(gw.origin, environ={"CAPMON_ADMIN_KEY": CANARY}))
        with pytest.raises(KeyRefused) as refused:
            await asyncio.to_thread(run_remote_dashboard, options)
    message = str(refused.value)
    assert "refused the admin key in $CAPMON_ADMIN_KEY" in message and CANARY not in message
