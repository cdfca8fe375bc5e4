"""The README's library example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.configs import shipped_config

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_library_example_runs_as_written(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "no python example in the README"
    example = tmp_path / "example.py"
    example.write_text(blocks[0])
    shipped_config(tmp_path, named="steady")  # on a free port, so a running capmon on 8089 cannot interfere
    out = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "answered:" in out.stdout and "attempt 1: flagship 200 ok" in out.stdout
    assert re.search(r"streamed [1-9]\d* pieces", out.stdout)
