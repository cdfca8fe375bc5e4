"""`capmon status` shows each target's provider API, in text and JSON: the shipped
config (on the steady scenario, on a free port), its simulator started in-process, every
target probed once over its own wire (claude's over Anthropic's /v1/messages and Vertex AI's
rawPredict, gemini-flash's over the Gemini API's and Vertex AI's generateContent)."""

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
    rows = {line.split()[2]: line.split() for line in lines[1:9]}  # by target
    assert [(r[0], r[1]) for r in rows.values()] == [
        ("flagship", "openai"),
        ("claude", "anthropic"),
        ("claude", "vertex"),
        ("claude", "bedrock"),
        ("medium", "openai"),
        ("gemini-flash", "gemini"),
        ("gemini-flash", "vertex"),
        ("small", "openai"),
    ]
    # each probed over its own wire: each answered
    assert {r[-1] for r in rows.values()} == {"200"}, rows

    data = json.loads(status(config, as_json=True))
    assert {t["target"]: t["api"] for t in data["targets"]} == {
        "flagship@sim/sim-key": "openai",
        "claude@sim-anthropic/sim-key": "anthropic",
        "claude@sim-vertex/sim-key": "vertex",
        "claude@sim-bedrock/sim-key": "bedrock",
        "medium@sim/sim-key": "openai",
        "gemini-flash@sim-gemini/sim-key": "gemini",
        "gemini-flash@sim-vertex/sim-key": "vertex",
        "small@sim/sim-key": "openai",
    }
