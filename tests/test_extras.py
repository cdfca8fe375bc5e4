"""`pip install capmon` brings the library and the dashboard; the rest are extras
(pyproject.toml, capmon/core/base/extras.py). Each case runs capmon in a fresh interpreter
where the packages an extra brings cannot be imported (tests/support/blocked.py: a
``sys.meta_path`` finder refusing them, as if they were not installed):

- the dashboard starts and serves real traffic, over httpx's own transport, against a
  provider (the simulator in another process, as a real provider would be) with none of
  starlette, uvicorn, redis, prometheus-client, aiohttp... (a real terminal: a pty);
- a command or setting whose extra is missing says which to install in one line, exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from capmon.core.base.extras import MODULES, Extra
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from tests.gateway.helpers import HELLO, running
from tests.support.blocked import CLI, NOT_IN_THE_CORE, ROOT, capmon_without, command, loaded_anyway, run_without
from tests.support.configs import SIMULATED_MODELS, write_config
from tests.support.scripted import free_port

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]


def blocks(extra: Extra) -> set[str]:
    """The top-level packages to block for ``extra`` to be missing."""
    return {m.split(".")[0] for m in MODULES[extra]} - {"h11"}  # h11: httpcore's, there with httpx


SIM = blocks(Extra.SIM)
GATEWAY = blocks(Extra.GATEWAY)


def _packages(extra: str) -> set[str]:
    """The distributions ``extra`` installs, the extras it names of capmon's own followed."""
    out: set[str] = set()
    for text in EXTRAS[extra]:
        req = Requirement(text)
        if req.name == "capmon":
            out = out.union(*(_packages(inner) for inner in req.extras))
        else:
            out.add(canonicalize_name(req.name))
    return out


def one_line(run: subprocess.CompletedProcess[str]) -> str:
    """The command's one error line: exit 2, nothing else on stderr, no traceback."""
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1, (run.returncode, run.stderr[-3000:])
    return lines[0]


def _installs(extra: Extra) -> str:
    return f"needs the {extra} extra: pip install 'capmon[{extra}]'"


# ---------------------------------------------------------------- pyproject.toml and the table of extras


def test_each_extra_installs_what_its_code_imports_and_the_core_none_of_it() -> None:
    owners = metadata.packages_distributions()  # top-level module -> the distributions providing it
    for extra, modules in MODULES.items():
        assert extra.value in EXTRAS, f"pyproject.toml has no extra {extra}"
        given = _packages(extra.value)
        for module in modules:
            dists = {canonicalize_name(d) for d in owners[module.split(".")[0]]}
            assert dists & given, f"{module} (from {dists}) is not installed by capmon[{extra}] ({sorted(given)})"
    core = {canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    extra_only = set().union(*(_packages(e.value) for e in Extra)) - {"h11"}  # h11: httpcore's, with httpx
    assert core & extra_only == set(), core
    assert _packages("test") >= extra_only  # the tests install every extra


# ---------------------------------------------------------------- the core install: library and dashboard


def _scrub(screen: bytes) -> str:
    return re.sub(r"\x1b(\[[0-9;?<>=$]*[A-Za-z]|\][^\x07]*\x07)", "", screen.decode(errors="replace"))


@contextlib.contextmanager
def provider() -> Iterator[tuple[str, list[str]]]:
    """The simulator serving in its own process (everything installed there), as a real
    provider would: its base URL, and its access log's lines as they come."""
    port = free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "capmon.cli", "sim", "--listen", f"127.0.0.1:{port}", "--scenario", "steady"]
        + ["--access-log"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert sim.stdout is not None
    out = sim.stdout
    threading.Thread(target=lambda: lines.extend(out), daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while not any("listening on" in line for line in lines):
            assert sim.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}/v1", lines
    finally:
        sim.terminate()
        sim.wait(10)


class Terminal:
    """A child process on a pty of 160 x 48, its screen read as it comes."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
        self.master = master
        self.screen = bytearray()
        env = {**os.environ, "TERM": "xterm-256color", **env}
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env)
        os.close(slave)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the child is gone and the pty with it
                return
            if not chunk:
                return
            self.screen.extend(chunk)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def wait(self, seconds: float) -> int:
        try:
            code = self.proc.wait(seconds)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(5)
            os.close(self.master)
        return code

    def text(self) -> str:
        return _scrub(bytes(self.screen))


def test_the_dashboard_runs_on_a_real_provider_with_the_core_install_only(tmp_path: Path) -> None:
    with provider() as (url, log):
        cfg = write_config(
            tmp_path / "config.toml",
            url,
            models=SIMULATED_MODELS,
            keys=[("PROVIDER_KEY", "provider")],
            dashboard={"refresh": 0.2, "demo_items": 40},
        )  # no simulator: [simulator] enabled = false
        term = Terminal(
            command(NOT_IN_THE_CORE, CLI, "--config", str(cfg)), cwd=tmp_path, env={"PROVIDER_KEY": SIMULATOR_DEMO_KEY}
        )
        answered = 0
        deadline = time.monotonic() + 60  # about two seconds on an idle machine
        while answered < 5 and term.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            answered = sum('"POST /v1/chat/completions HTTP/1.1" 200' in line for line in log)
        term.type(b"q")
        code = term.wait(30)
    screen = term.text()
    assert answered >= 5, (answered, screen[-3000:])  # the demo job's requests, answered
    assert code == 0, screen[-3000:]
    assert "demo job" in screen and re.search(r"flagship +openai +● closed", screen), screen[-3000:]
    assert loaded_anyway(screen) == "[]"


def test_the_default_transport_without_aiohttp_is_httpx_and_aiohttp_by_name_says_what_to_install() -> None:
    code = """
import asyncio
from capmon import FallbackClient
from capmon.core.types.config import parse_config
from capmon.core.base.exceptions import MissingExtra
from capmon.core.routing.transport import HttpcoreTransport

BASE = '[simulator]\\nenabled = false\\n[[endpoints]]\\nname = "e"\\nbase_url = "http://127.0.0.1:9/v1"\\n'
BASE += 'keys = [{ env = "K" }]\\n[[models]]\\nname = "m"\\nendpoints = ["e"]\\n'

async def main():
    async with FallbackClient(parse_config(BASE, "default.toml"), environ={"K": "k"}) as client:
        print(type(client._http.transport).__name__, isinstance(client._http.transport, HttpcoreTransport))
    try:
        FallbackClient(parse_config(BASE + '[client]\\ntransport = "aiohttp"\\n', "fast.toml"), environ={"K": "k"})
    except MissingExtra as e:
        print(e)

asyncio.run(main())
"""
    run = run_without(blocks(Extra.AIOHTTP), code)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "HttpcoreTransport True"
    assert lines[1] == f'fast.toml: client.transport = "aiohttp" {_installs(Extra.AIOHTTP)}'
    assert loaded_anyway(run.stdout) == "[]"


def test_vertex_without_keys_and_without_the_google_extra_says_what_to_install() -> None:
    code = """
from capmon import FallbackClient
from capmon.core.types.config import parse_config
from capmon.core.base.exceptions import MissingExtra

BASE = '[simulator]\\nenabled = false\\n[[endpoints]]\\nname = "vx"\\napi = "vertex"\\nproject = "my-project-1"\\n'
BASE += 'region = "global"\\n'
MODEL = '[[models]]\\nname = "m"\\napi_model = "gemini-2.5-flash"\\nendpoints = ["vx"]\\n'
FallbackClient(parse_config(BASE + 'keys = [{ env = "T" }]\\n' + MODEL, "token.toml"), environ={"T": "ya29.token"})
print("a token in keys: no extra needed")
try:
    FallbackClient(parse_config(BASE + "keys = []\\n" + MODEL, "adc.toml"), environ={})
except MissingExtra as e:
    print(e)
"""
    run = run_without(blocks(Extra.GOOGLE), code)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "a token in keys: no extra needed"
    assert lines[1] == f'endpoint "vx" (api = "vertex", keys = []) {_installs(Extra.GOOGLE)}'
    assert loaded_anyway(run.stdout) == "[]"


def test_bedrock_without_the_aws_extra_says_what_to_install() -> None:
    """Either key: SigV4 and the event stream's decoder are both botocore's."""
    code = """
from capmon import FallbackClient
from capmon.core.types.config import parse_config
from capmon.core.base.exceptions import MissingExtra

BASE = '[simulator]\\nenabled = false\\n[[endpoints]]\\nname = "br"\\napi = "bedrock"\\nregion = "us-east-1"\\n'
MODEL = '[[models]]\\nname = "m"\\napi_model = "us.anthropic.claude-haiku-4-5-20251001-v1:0"\\nendpoints = ["br"]\\n'
for keys, env in (("keys = []", {}), ('keys = [{ env = "T" }]', {"T": "ABSKexample"})):
    try:
        FallbackClient(parse_config(BASE + keys + "\\n" + MODEL, "b.toml"), environ=env)
    except MissingExtra as e:
        print(e)
"""
    run = run_without(blocks(Extra.AWS), code)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == f'endpoint "br" (api = "bedrock", keys = []) {_installs(Extra.AWS)}'
    assert lines[1] == f'endpoint "br" (api = "bedrock") {_installs(Extra.AWS)}'
    assert loaded_anyway(run.stdout) == "[]"


# ---------------------------------------------------------------- a missing extra: one line, exit 2


def test_serve_without_the_gateway_extra(tmp_path: Path) -> None:
    run = capmon_without(GATEWAY, ["serve", "--listen", "127.0.0.1:0"], cwd=tmp_path)
    assert one_line(run) == f"capmon: capmon serve {_installs(Extra.GATEWAY)}"


def test_the_simulator_without_the_sim_extra(tmp_path: Path) -> None:
    run = capmon_without(SIM, ["sim", "--listen", "127.0.0.1:0"])
    assert one_line(run) == f"capmon: capmon sim {_installs(Extra.SIM)}"
    listed = capmon_without(SIM, ["sim", "--list"])  # the scenarios are plain TOML: no web server
    assert listed.returncode == 0 and "steady" in listed.stdout, listed.stderr
    # A config that starts the embedded simulator (the bundled demo's does), from any command.
    cfg = tmp_path / "config.toml"
    cfg.write_text((ROOT / "config.toml").read_text().replace("127.0.0.1:8089", f"127.0.0.1:{free_port()}"))
    for argv in (["status", "--config", str(cfg)], ["--config", str(cfg)]):  # the bare dashboard, off a terminal
        run = capmon_without(SIM, argv, cwd=tmp_path)
        assert one_line(run) == f"capmon: {cfg}: simulator.enabled = true {_installs(Extra.SIM)}"


def test_the_dashboard_says_so_before_its_screen_opens(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text((ROOT / "config.toml").read_text().replace("127.0.0.1:8089", f"127.0.0.1:{free_port()}"))
    term = Terminal(command(SIM, CLI, "--config", str(cfg)), cwd=tmp_path, env={})
    code = term.wait(30)
    assert code == 2
    assert b"\x1b[?1049h" not in term.screen  # the dashboard never took the terminal (its alternate screen)
    lines = [line for line in term.text().splitlines() if line.strip()]
    assert lines[0] == f"capmon: {cfg}: simulator.enabled = true {_installs(Extra.SIM)}", lines
    assert lines[1:] == ["blocked-but-loaded: []"]


def test_redis_without_the_fleet_extra(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path / "config.toml", extra='[shared]\nbackend = "redis"\nurl = "redis://127.0.0.1:6379/0"\n'
    )
    env = {"TEST_KEY_A": "sk-test-aaaaaaaaaaaaaaaa"}
    run = capmon_without(blocks(Extra.FLEET), ["status", "--config", str(cfg)], cwd=tmp_path, env=env)
    assert one_line(run) == f'capmon: {cfg}: shared.backend = "redis" {_installs(Extra.FLEET)}'
    # The gateway says so before it binds its port or starts a worker.
    argv = ["serve", "--config", str(cfg), "--listen", "127.0.0.1:0", "--workers", "2"]
    run = capmon_without(blocks(Extra.FLEET), argv, cwd=tmp_path, env=env)
    assert one_line(run) == f'capmon: {cfg}: shared.backend = "redis" {_installs(Extra.FLEET)}'


def test_aiohttp_by_name_without_its_extra(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "config.toml", client={"transport": "aiohttp"})
    env = {"TEST_KEY_A": "sk-test-aaaaaaaaaaaaaaaa"}
    run = capmon_without(blocks(Extra.AIOHTTP), ["status", "--config", str(cfg)], cwd=tmp_path, env=env)
    assert one_line(run) == f'capmon: {cfg}: client.transport = "aiohttp" {_installs(Extra.AIOHTTP)}'


def test_postgresql_without_the_postgres_extra(tmp_path: Path) -> None:
    url = "postgresql://postgres@127.0.0.1:5432/test"
    run = capmon_without(blocks(Extra.POSTGRES), ["batch", "list", "--db", url], cwd=tmp_path)
    assert one_line(run) == f"capmon: --db {url} {_installs(Extra.POSTGRES)}"
    run = capmon_without(blocks(Extra.POSTGRES), ["report", "job"], cwd=tmp_path, env={"CAPMON_DB": url})
    assert one_line(run) == f"capmon: the job store {url} {_installs(Extra.POSTGRES)}"


def test_uvloop_without_its_extra(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "config.toml")
    argv = ["serve", "--config", str(cfg), "--listen", "127.0.0.1:0", "--loop", "uvloop"]
    run = capmon_without(blocks(Extra.UVLOOP), argv, cwd=tmp_path, env={"TEST_KEY_A": "sk-test-aaaaaaaaaaaaaaaa"})
    assert one_line(run) == f"capmon: --loop uvloop {_installs(Extra.UVLOOP)}"


def test_the_in_process_sdk_clients_without_the_gateway_extra() -> None:
    code = """
import capmon
try:
    capmon.openai_client
except ImportError as e:  # MissingExtra: a CapmonError and an ImportError
    print(type(e).__name__, isinstance(e, capmon.CapmonError), e)
"""
    run = run_without(("starlette", "prometheus_client"), code)
    assert run.returncode == 0, run.stderr[-3000:]
    expected = f"MissingExtra True capmon.inprocess (the in-process SDK clients) {_installs(Extra.GATEWAY)}"
    assert run.stdout.splitlines()[0] == expected


async def test_connect_needs_no_extra() -> None:
    # --connect reads a gateway's control API over httpx: the core install watches a gateway.
    async with running() as gw, gw.http() as http:
        assert (await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO})).status_code == 200
        proc = await asyncio.create_subprocess_exec(
            *command(NOT_IN_THE_CORE, CLI, "status", "--connect", gw.origin),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert "requests: 1 (1 ok, 0 failed, 0 cancelled, 0 in progress)" in out.decode()
    assert loaded_anyway(out.decode()) == "[]"


@pytest.mark.parametrize("argv", [["serve"], ["sim"]], ids=["serve", "sim"])
def test_with_the_extra_installed_nothing_is_said(argv: list[str], tmp_path: Path) -> None:
    # Everything installed (this venv): the checks pass and the command goes on, here to its
    # own refusal of a bad address, before it would serve.
    run = subprocess.run(
        [sys.executable, "-m", "capmon.cli", *argv, "--listen", "nowhere"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert one_line(run).startswith("capmon: ") and "nowhere" in run.stderr and "extra" not in run.stderr


# ---------------------------------------------------------------- the lock CI installs


def test_the_lock_pins_every_package_pyproject_names_within_its_ranges() -> None:
    # .ci/constraints.txt (made by .ci/lock) against pyproject.toml: a range or pin changed
    # there without the lock refreshed is caught here, not by a CI that installs something else.
    locked: dict[str, str] = {}
    for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            locked[canonicalize_name(name)] = version
    wanted = list(PYPROJECT["project"]["dependencies"])
    for extra in ("test", "langchain", *(e.value for e in Extra)):
        wanted += [r for r in EXTRAS[extra] if Requirement(r).name != "capmon"]
    for text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in locked, f"{text}: not in .ci/constraints.txt (run .ci/lock)"
        assert req.specifier.contains(locked[name], prereleases=True), f"{text}: locked at {locked[name]}"
