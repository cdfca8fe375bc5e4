"""The library's examples run as written: the README's short one, and the whole one in
docs/library.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from capmon.core.types.config import parse_config
from tests.support.configs import shipped_config

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_first_python_block(doc: str, tmp_path: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
    assert blocks, f"no python example in {doc}"
    example = tmp_path / "example.py"
    example.write_text(blocks[0])
    shipped_config(tmp_path, named="steady")  # on a free port, so a running capmon on 8089 cannot interfere
    out = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "answered:" in out.stdout and "attempt 1: flagship 200 ok" in out.stdout
    assert re.search(r"streamed [1-9]\d* pieces", out.stdout)
    return out.stdout


def test_the_readme_library_example_runs_as_written(tmp_path: Path) -> None:
    _run_first_python_block("README.md", tmp_path)


def test_the_whole_library_example_runs_as_written(tmp_path: Path) -> None:
    out = _run_first_python_block("docs/library.md", tmp_path)
    # its Anthropic-shaped request, answered in Anthropic's format by a model on OpenAI's wire
    assert re.search(r"^flagship \(openai\) (end_turn|max_tokens) ", out, re.M), out


def _commands() -> tuple[str, str]:
    """The README's two commands: install and run the dashboard, install and run the tests."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return blocks[0].strip(), blocks[1].strip()


def test_the_first_command_installs_what_the_dashboards_demo_needs() -> None:
    from capmon.core.base.extras import Extra
    from capmon.core.types.config import load_config

    run, _ = _commands()
    extras = re.search(r"pip install -e '\.\[([a-z,]+)\]'", run)
    assert extras is not None, run
    # `capmon` with no config of its own runs the bundled demo on the embedded simulator.
    assert load_config(ROOT / "capmon" / "default_config.toml").simulator.enabled
    assert Extra.SIM.value in extras.group(1).split(","), run


def test_ci_runs_the_readmes_test_command_word_for_word_from_the_lock() -> None:
    _, test = _commands()
    assert "pip install -c .ci/constraints.txt -e '.[test]'" in test
    steps = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert steps[-1] == test


def test_the_readmes_config_for_every_cloud_loads_with_its_deployments() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Switching to a real provider") :]
    (block,) = re.findall(r"```toml\n(.*?)```", section, re.S)[:1]
    cfg = parse_config(block, "README.md")
    assert {e.api.value for e in cfg.endpoints} == {"openai", "azure", "anthropic", "gemini", "vertex", "bedrock"}
    claude = next(m for m in cfg.models if m.name == "claude-sonnet")
    assert [d.endpoint for d in claude.deployed()] == ["anthropic", "vertex-us", "bedrock-us"]
    # the defaults the README leaves out: each cloud's own host
    hosts = {e.name: e.base_url for e in cfg.endpoints}
    assert hosts["vertex-us"] == "https://us-east5-aiplatform.googleapis.com"
    assert hosts["bedrock-us"] == "https://bedrock-runtime.us-east-1.amazonaws.com"
