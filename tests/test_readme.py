"""The library's examples run as written: the README's short one, and the whole one in
docs/library.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
    # The shipped config, on a free port so a running capmon on 8089 cannot interfere.
    port = _free_port()
    config = (ROOT / "config.toml").read_text().replace("127.0.0.1:8089", f"127.0.0.1:{port}")
    config = config.replace('scenario = "demo"', 'scenario = "steady"')
    (tmp_path / "config.toml").write_text(config)
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
