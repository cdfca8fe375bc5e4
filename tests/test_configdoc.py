"""docs/config.md is the config's schema as it is now: every table and key, with its doc."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from capmon.configdoc import COMMAND, PATH, render
from capmon.core.base.schema import document
from capmon.core.types.config import Config

ROOT = Path(__file__).resolve().parents[1]


def test_docs_config_md_is_what_the_schema_says() -> None:
    written = (ROOT / PATH).read_text(encoding="utf-8")
    assert written == render(), f"{PATH} is stale: run `{COMMAND}` at the repository root and commit it"


def test_every_table_and_key_of_the_config_says_what_it_does() -> None:
    missing = [f"{t.path}.{k.name}".lstrip(".") for t in document(Config) for k in t.keys if not k.doc.strip()]
    assert missing == [], f"add a doc= to each of these keys in capmon/core/types/config.py, then run `{COMMAND}`"


def test_every_key_is_in_the_reference() -> None:
    text = render()
    for t in document(Config)[1:]:
        section = text.split(f"## `{'[[' if t.array else '['}{t.path}{']]' if t.array else ']'}`\n", 1)[1]
        section = section.split("\n## ", 1)[0]
        assert [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")] == [
            k.name for k in t.keys
        ], t.path


def test_the_command_writes_the_reference(tmp_path: Path) -> None:
    out = tmp_path / "config.md"
    done = subprocess.run(
        [sys.executable, "-m", "capmon.configdoc", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text(encoding="utf-8") == render()
