"""`capmon serve` as a user runs it: the README's examples (the openai SDK and curl) run
as written against it on the shipped config's simulator; Ctrl+C stops it with 130; a
gateway that cannot start says why in one line with exit code 2."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from capmon.cli import main
from capmon.core.base.secrets import Secret
from capmon.gateway.gateway_log import log_handler
from tests.support.configs import shipped_config
from tests.support.scripted import free_port

ROOT = Path(__file__).resolve().parents[2]


def _gateway_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## The gateway\n")
    return readme[start : readme.index("\n## ", start + 1)]


def _block(lang: str) -> str:
    found = re.findall(rf"```{lang}\n(.*?)```", _gateway_section(), re.S)
    assert found, f"no {lang} example in the README's gateway section"
    return found[0] if lang != "sh" else next(b for b in found if "curl" in b)


# The shipped models with quick answers: the examples' requests take milliseconds, not seconds.
FAST = "".join(
    f"""
[[models]]
name = "sim-{m}"
slots = 64
base_latency = 0.05
per_token = 0.0002
noise = 0.0
answer_tokens = 40
context_window = 128000
"""
    for m in ("flagship", "medium", "small")
)


def _shipped_config(tmp_path: Path) -> Path:
    return shipped_config(tmp_path, 'name = "fast"\n' + FAST)[0]


def test_the_readme_examples_run_as_written_against_capmon_serve(tmp_path: Path) -> None:
    port = free_port()
    config = _shipped_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPMON_")}
    access = tmp_path / "access.jsonl"
    argv = ["serve", "--config", str(config), "--listen", f"127.0.0.1:{port}", "--access-log", str(access)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "capmon.cli", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert f"listening on http://127.0.0.1:{port}/v1" in banner, proc.stderr.read() if proc.stderr else ""
        assert "simulator http://127.0.0.1:" in banner and "loopback only" in banner
        example = tmp_path / "example.py"
        example.write_text(_block("python").replace("127.0.0.1:4000", f"127.0.0.1:{port}"))
        script = _block("sh").replace("127.0.0.1:4000", f"127.0.0.1:{port}")
        with subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as c:
            sdk = subprocess.run(
                [sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=60
            )
            curl_out, curl_err = c.communicate(timeout=60)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert sdk.returncode == 0, sdk.stderr[-3000:]
    assert re.match(r"served by flagship in 1 attempt\(s\): \w", sdk.stdout), sdk.stdout
    assert re.search(r"^streamed: \w+", sdk.stdout, re.M), sdk.stdout
    assert c.returncode == 0, curl_err
    head, _, body = curl_out.replace("\r\n", "\n").partition("\n\n")
    assert head.startswith("HTTP/1.1 200") and "x-capmon-model: flagship" in head
    assert "x-capmon-priority: batch" in head and "x-litellm-attempted-fallbacks: 0" in head
    assert '"choices"' in body
    assert proc.returncode == 130 and "capmon gateway: stopped" in err and "Traceback" not in err
    lines = [json.loads(line) for line in access.read_text().splitlines()]
    served = [line for line in lines if line["path"] == "/v1/chat/completions"]
    assert len(served) >= 3 and all(line["status"] == 200 and line["model_served"] for line in served)
    curls = re.findall(r"^x-request-id: (\S+)$", head, re.M)
    assert len(curls) == 1 and curls[0] in {line["request_id"] for line in served}


@pytest.mark.parametrize(
    "gateway, argv, expected",
    [
        (
            "",
            ["--listen", "0.0.0.0:4000"],
            r"capmon: .*config\.toml: gateway\.keys: listening on 0\.0\.0\.0:4000 \(not loopback\) needs at least one "
            r"client key",
        ),
        (
            "",
            ["--listen", "localhost"],
            r"capmon: --listen: expected HOST:PORT such as 127\.0\.0\.1:4000, got 'localhost'",
        ),
        (
            'keys = [{ env = "GW_NOT_SET_ANYWHERE" }]',
            [],
            r"gateway\.keys\[0\]\.env: environment variable GW_NOT_SET_ANYWHERE is not set",
        ),
        (
            'keys = [{ env = "GW_K", priority = "urgent" }]',
            [],
            r"gateway\.keys\[0\]\.priority: expected one of interactive, batch, got 'urgent'",
        ),
        (
            'admin_key_env = "GW_NOT_SET_ANYWHERE"',
            [],
            r"gateway\.admin_key_env: environment variable GW_NOT_SET_ANYWHERE is not set",
        ),
        ("listn = 1", [], r"gateway\.listn: unknown key; did you mean 'listen'\?"),
        ("", ["--access-log", "/no/such/dir/a.log"], r"gateway\.access_log: cannot open the access log: No such file"),
    ],
)
def test_a_gateway_that_cannot_start_says_why_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gateway: str, argv: list[str], expected: str
) -> None:
    config = _shipped_config(tmp_path)
    if gateway:
        config.write_text(config.read_text() + f"\n[gateway]\n{gateway}\n")
    assert main(["serve", "--config", str(config), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(expected, err), err


@pytest.mark.parametrize(
    "alias, expected",
    [
        (
            '"gpt-5" = "flagshp"',
            r"capmon: .*config\.toml: gateway\.aliases\.gpt-5: no model named 'flagshp'; did you mean 'flagship'\?",
        ),
        (
            '"claude-opus-*" = "claud"',
            r'capmon: .*config\.toml: gateway\.aliases\."claude-opus-\*": no model named \'claud\'; did you mean',
        ),
        ('"auto" = "flagship"', r"gateway\.aliases\.auto: 'auto' is built in"),
    ],
)
def test_a_bad_alias_in_the_shipped_table_says_why_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], alias: str, expected: str
) -> None:
    config = _shipped_config(tmp_path)
    text = config.read_text()
    assert text.count("\n[gateway.aliases]\n") == 1
    config.write_text(text.replace("\n[gateway.aliases]\n", f"\n[gateway.aliases]\n{alias}\n"))
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(expected, err), err


def test_an_address_in_use_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--config", str(_shipped_config(tmp_path)), "--listen", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"capmon: 127.0.0.1:{port} is already in use; choose another address with --listen or [gateway] listen"
    )


def test_the_gateways_log_redacts_every_key_it_holds() -> None:
    key = Secret("sk-gateway-log-canary-99887766", "team")
    out = io.StringIO()
    handler = log_handler(out)
    logger = logging.getLogger("some.library.that.logs.headers")
    logger.addHandler(handler)
    try:
        logger.warning("sent headers %r", {"authorization": f"Bearer {key.reveal()}"})
    finally:
        logger.removeHandler(handler)
    assert key.reveal() not in out.getvalue() and "[redacted]" in out.getvalue()
