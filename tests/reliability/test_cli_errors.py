"""What a user sees when a file is wrong: exit code 2, one line naming the file and the
key, and no traceback. Most cases run `capmon.cli.main` in-process (fast); two run the
real console entry point in a subprocess to prove the exit code and stderr end to end."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from capmon.cli import EXIT_USAGE, main
from tests.support.configs import shipped_config

ROOT = Path(__file__).resolve().parents[2]
CAPMON = [sys.executable, "-m", "capmon.cli"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("capmon: "), err
    return lines[0]


BAD_SCENARIO = """
name = "bad"
[[models]]
name = "sim-flagship"
slotz = 4
"""


# ---------------------------------------------------------------- capmon sim


def test_sim_with_a_missing_scenario_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "sim", "--scenario", "/nonexistent.toml")
    assert code == EXIT_USAGE
    line = one_error_line(err)
    assert line.startswith("capmon: /nonexistent.toml: no bundled scenario or file by that name; bundled: ")
    assert "demo" in line


@pytest.mark.parametrize(
    ("text", "key", "detail"),
    [
        pytest.param(BAD_SCENARIO, "models[0].slotz", "unknown key; did you mean 'slots'?", id="unknown-key"),
        pytest.param(
            '[[models]]\nname = "m"\nslots = "four"',
            "models[0].slots",
            "expected a whole number, got 'four' (str)",
            id="wrong-type",
        ),
        pytest.param(
            '[[models]]\nname = "m"\ndialect = "openai-500"',
            "models[0].dialect",
            "expected one of openai-429",
            id="bad-dialect",
        ),
        pytest.param(
            '[[models]]\nname = "m"\n[[models.schedule]]\nat = 5\n[[models.schedule]]\nat = 1',
            "models[0].schedule[1].at",
            "expected phases in time order",
            id="schedule-order",
        ),
        pytest.param('name = "x"', "models", "expected at least one [[models]] table", id="no-models"),
        pytest.param(
            '[[models]]\nname = "m"\nhint = 1e308', "models[0].hint", "expected a number <= ", id="absurd-hint"
        ),
    ],
)
def test_sim_with_a_bad_scenario_names_the_file_and_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, key: str, detail: str
) -> None:
    path = tmp_path / "scn.toml"
    path.write_text(text)
    code, _, err = run(capsys, "sim", "--scenario", str(path))
    assert code == EXIT_USAGE
    line = one_error_line(err)
    assert line.startswith(f"capmon: {path}: {key}: "), line
    assert detail in line


@pytest.mark.parametrize(
    ("content", "detail"),
    [(b"models = [", "not valid TOML"), (b"\xff\xfe\x00", "cannot read")],
    ids=["bad-toml", "not-utf8"],
)
def test_sim_with_an_unreadable_scenario(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, detail: str
) -> None:
    path = tmp_path / "scn.toml"
    path.write_bytes(content)
    code, _, err = run(capsys, "sim", "--scenario", str(path))
    assert code == EXIT_USAGE
    assert one_error_line(err).startswith(f"capmon: {path}: {detail}")


def test_sim_with_a_bad_listen_address(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "sim", "--listen", "nowhere")
    assert code == EXIT_USAGE
    assert one_error_line(err) == "capmon: expected HOST:PORT such as 127.0.0.1:8089, got 'nowhere'"


def test_sim_on_a_port_that_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, _, err = run(capsys, "sim", "--listen", f"127.0.0.1:{port}", "--scenario", "steady")
    assert code == EXIT_USAGE
    assert one_error_line(err).startswith(f"capmon: the simulator cannot listen on 127.0.0.1:{port}: ")


# ---------------------------------------------------------------- config files


def test_status_with_a_missing_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    code, _, err = run(capsys, "status", "--once", "--config", str(missing))
    assert code == EXIT_USAGE
    assert one_error_line(err) == f"capmon: {missing}: no such file"


def test_the_config_from_the_environment_is_named_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = shipped_config(tmp_path, replace={"max_attempts = 50": "max_attempts = 0"})[0]
    monkeypatch.setenv("CAPMON_CONFIG", str(path))
    code, _, err = run(capsys, "status", "--once")
    assert code == EXIT_USAGE
    assert one_error_line(err) == f"capmon: {path}: client.max_attempts: expected a whole number >= 1, got 0"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param("[breaker]", "[breaker\n", "not valid TOML", id="bad-toml"),
        pytest.param(
            "cooldown = 8.0", "cooldwn = 8.0", "breaker.cooldwn: unknown key; did you mean 'cooldown'?", id="typo"
        ),
        pytest.param(
            'endpoints = ["sim"]',
            'endpoints = ["simm"]',
            "models[0].endpoints[0]: no endpoint named 'simm'; did you mean 'sim'?",
            id="bad-reference",
        ),
        pytest.param(
            'base_url = "http://127.0.0.1',
            'base_url = "127.0.0.1',
            "endpoints[0].base_url: expected an http:// or https:// URL",
            id="bad-url",
        ),
        pytest.param("max_tokens = 512", 'max_tokens = 512\n"" = 1', 'models[0]."": unknown key', id="empty-key"),
        pytest.param(
            "retry_budget = 0.2",
            "retry_budget = nan",
            "client.retry_budget: expected a finite number, got nan (float)",
            id="nan",
        ),
        pytest.param(
            "deadline = 900.0",
            "deadline = 1979-05-27",
            "client.deadline: expected a number, got datetime.date(1979, 5, 27) (date)",
            id="date",
        ),
    ],
)
def test_status_with_a_wrong_config_names_the_file_and_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, old: str, new: str, expected: str
) -> None:
    path = shipped_config(tmp_path, replace={old: new})[0]
    code, _, err = run(capsys, "status", "--once", "--config", str(path))
    assert code == EXIT_USAGE
    line = one_error_line(err)
    assert line.startswith(f"capmon: {path}: "), line
    assert expected in line, line


def test_status_with_a_config_whose_scenario_is_bad(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "scn.toml").write_text(BAD_SCENARIO)
    path = shipped_config(tmp_path, replace={'scenario = "demo"': 'scenario = "scn.toml"'})[0]
    code, _, err = run(capsys, "status", "--once", "--config", str(path))
    assert code == EXIT_USAGE
    line = one_error_line(err)
    assert line.startswith(f"capmon: {tmp_path / 'scn.toml'}: models[0].slotz: unknown key"), line


def test_status_with_a_missing_key_variable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CAPMON_SIM_API_KEY", raising=False)
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    path = shipped_config(tmp_path, replace={"simulated = true": "simulated = false"})[0]
    path.write_text(path.read_text().replace('env = "CAPMON_SIM_API_KEY"', 'env = "NOT_SET_ANYWHERE"'))
    code, _, err = run(capsys, "status", "--once", "--config", str(path))
    assert code == EXIT_USAGE
    assert one_error_line(err) == (
        f"capmon: {path}: endpoints[0].keys[0].env: environment variable NOT_SET_ANYWHERE is not set"
        " (endpoints[1].keys[0].env, endpoints[2].keys[0].env, endpoints[3].keys[0].env, endpoints[4].keys[0].env)"
    )


def test_bad_arguments_exit_2_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--refresh", "soon"], ["nonsense"], ["sim", "--bogus"]):
        code, _, err = run(capsys, *argv)
        assert code == EXIT_USAGE and err.startswith("usage: capmon") and "Traceback" not in err


# ---------------------------------------------------------------- end to end


def test_the_console_script_exits_2_without_a_traceback(tmp_path: Path) -> None:
    scn = tmp_path / "scn.toml"
    scn.write_text(BAD_SCENARIO)
    out = subprocess.run([*CAPMON, "sim", "--scenario", str(scn)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"capmon: {scn}: models[0].slotz: unknown key; did you mean 'slots'?\n"
    out = subprocess.run(
        [*CAPMON, "sim", "--scenario", "/nonexistent.toml"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("capmon: /nonexistent.toml: no bundled scenario or file by that name")
