"""`capmon status` shows each target's provider API, in text and JSON: the shipped
config (on the steady scenario, on a free port), its simulator started in-process, every
target probed once over its own wire (claude's over Anthropic's /v1/messages)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from capmon.status import StatusOptions, run_status
from tests.support.configs import shipped_config

ROOT = Path(__file__).resolve().parent.parent


def shipped(tmp_path: Path) -> str:
    return str(shipped_config(tmp_path, named="steady")[0])


def status(config: str, *, as_json: bool) -> str:
    out = io.StringIO()
    assert run_status(StatusOptions(config=config, json=as_json, probe=True), out) == 0
    return out.getvalue()


def test_status_text_and_json_name_each_targets_api(tmp_path: Path) -> None:
    config = shipped(tmp_path)
    lines = status(config, as_json=False).splitlines()
    assert lines[0].split()[:3] == ["model", "api", "target"]
    rows = {line.split()[0]: line.split() for line in lines[1:5]}
    assert rows["claude"][1:3] == ["anthropic", "claude@sim-anthropic/sim-key"]
    assert rows["claude"][-1] == "200"  # probed over Anthropic's wire: it answered
    assert [rows[m][1] for m in ("flagship", "medium", "small")] == ["openai"] * 3

    data = json.loads(status(config, as_json=True))
    assert {t["model"]: t["api"] for t in data["targets"]} == {
        "flagship": "openai",
        "claude": "anthropic",
        "medium": "openai",
        "small": "openai",
    }
