"""The command line as a user meets it: `capmon sim`, `capmon status`, bad configs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.configs import NO_SUCH_HOST, shipped_config, write_config
from tests.support.scripted import free_port

ROOT = Path(__file__).resolve().parents[1]
CAPMON = [sys.executable, "-m", "capmon.cli"]


def test_capmon_sim_answers_its_models_once_started() -> None:
    # Not a speed test (startup time is no assertion on a shared machine): it starts and answers.
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [*CAPMON, "sim", "--listen", f"127.0.0.1:{port}", "--scenario", "steady", "--access-log"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        answered = None
        while time.monotonic() - started < 30:
            try:
                r = httpx.get(
                    f"http://127.0.0.1:{port}/v1/models",
                    headers={"Authorization": "Bearer sk-capmon-sim-demo"},
                    timeout=1,
                )
                if r.status_code == 200:
                    answered = time.monotonic() - started
                    break
            except httpx.TransportError:
                time.sleep(0.02)
        assert answered is not None, f"no answer in 30 s: {proc.poll()}"
        assert [m["id"] for m in r.json()["data"]] == ["sim-flagship", "sim-medium", "sim-small"]
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert f"listening on http://127.0.0.1:{port}/v1" in out
    assert '"GET /v1/models HTTP/1.1" 200' in out  # --access-log: every request


def test_capmon_sim_lists_its_scenarios_and_python_m_capmon_sim_is_the_same_command() -> None:
    out = subprocess.run([*CAPMON, "sim", "--list"], capture_output=True, text=True, check=True)
    names = [line.split()[0] for line in out.stdout.splitlines()]
    assert {"demo", "steady", "peak-hours", "outage", "brownout"} <= set(names)
    assert "Flagship has 0 slots" in out.stdout  # each with its description
    module = [sys.executable, "-m", "capmon.sim"]
    assert subprocess.run([*module, "--list"], capture_output=True, text=True, check=True).stdout == out.stdout
    bad = subprocess.run([*module, "--listen", "nowhere"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("capmon: ")  # the one CLI's errors and exit codes


def test_status_prints_a_snapshot_as_json_with_the_embedded_simulator(tmp_path: Path) -> None:
    cfg = shipped_config(tmp_path, named="steady")[0]
    out = subprocess.run(
        [*CAPMON, "status", "--once", "--json", "--probe", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert [t["model"] for t in snap["targets"]] == [
        "flagship",
        "claude",
        "claude",  # its second deployment, on Vertex AI
        "claude",  # its third, on Bedrock
        "medium",
        "gemini-flash",
        "gemini-flash",
        "small",
    ]
    assert all(t["last_status"] == 200 and t["state"] == "closed" for t in snap["targets"])


def test_bare_capmon_prints_the_status_when_stdout_is_not_a_terminal(tmp_path: Path) -> None:
    cfg = shipped_config(tmp_path, named="steady")[0]
    out = subprocess.run([*CAPMON, "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "flagship@sim/sim-key" in out.stdout and "closed" in out.stdout


def test_a_wrong_config_exits_2_naming_the_file_and_key(tmp_path: Path) -> None:
    cfg, _ = shipped_config(tmp_path, name="bad.toml", replace={"failure_threshold = 3": 'failure_threshold = "three"'})
    out = subprocess.run(
        [*CAPMON, "status", "--once", "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert f"{cfg}: breaker.failure_threshold: expected a whole number" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_missing_key_variable_is_reported_at_start(tmp_path: Path) -> None:
    cfg, _ = shipped_config(tmp_path, name="real.toml", replace={"simulated = true": "simulated = false"})
    env = {k: v for k, v in os.environ.items() if k != "CAPMON_SIM_API_KEY"}
    out = subprocess.run(
        [*CAPMON, "status", "--once", "--config", str(cfg)], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 2
    assert "endpoints[0].keys[0].env" in out.stderr and "CAPMON_SIM_API_KEY is not set" in out.stderr


def test_a_config_naming_a_missing_scenario_names_the_config_key(tmp_path: Path) -> None:
    cfg = shipped_config(tmp_path, named="nowhere.toml")[0]
    out = subprocess.run(
        [*CAPMON, "status", "--once", "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert f"{cfg}: simulator.scenario: " in out.stderr and "nowhere.toml" in out.stderr
    assert "Traceback" not in out.stderr


def test_dashboard_options_refuse_a_refresh_out_of_bounds_naming_the_value() -> None:
    from capmon.core.base.exceptions import CapmonError
    from capmon.tui.app import DashboardOptions

    assert DashboardOptions(refresh=0.05).refresh == 0.05 and DashboardOptions().refresh is None
    for bad in (0.01, 20.0):
        with pytest.raises(CapmonError, match=rf"^refresh must be between 0.05 and 10 seconds, got {bad:g}$"):
            DashboardOptions(refresh=bad)


def test_the_dashboard_refuses_a_missing_job_file_before_the_screen_opens(tmp_path: Path) -> None:
    from capmon.core.base.exceptions import CapmonError
    from capmon.tui.app import DashboardOptions, run_dashboard

    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(CapmonError, match=rf"^{re.escape(str(missing))}: no such input file$"):
        run_dashboard(DashboardOptions(config=str(shipped_config(tmp_path, named="steady")[0]), job=missing))


def test_job_and_attach_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    from capmon.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--job", "in.jsonl", "--attach", "nightly"])
    assert info.value.code == 2
    assert "argument --attach: not allowed with argument --job" in capsys.readouterr().err


def test_status_probe_exits_3_and_names_the_cause_when_an_endpoint_cannot_be_reached(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "config.toml", NO_SUCH_HOST, endpoint="openai", keys=[], models=["gpt-4o"])
    out = subprocess.run(
        [*CAPMON, "status", "--once", "--probe", "--config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 3, out
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("unreachable: "))
    assert "endpoint openai (capmon-no-such-host.invalid) is unreachable: DNS lookup failed" in line
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("gpt-4o"))
    assert "unreachable" in row and row.split()[-1] == "-"  # no status: nothing answered
