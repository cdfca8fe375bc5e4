from __future__ import annotations

from pathlib import Path

import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.types.config import (
    SIMULATOR_DEMO_KEY,
    bundled_config_path,
    find_config,
    load_config,
    parse_config,
    resolve_keys,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """
[[endpoints]]
name = "openai"
base_url = "https://api.openai.com/v1"
keys = [{ env = "OPENAI_API_KEY" }]

[[models]]
name = "gpt-4o"
endpoints = ["openai"]
"""


def test_the_shipped_config_loads_and_matches_the_bundled_default() -> None:
    cfg = load_config(ROOT / "config.toml")
    assert [m.name for m in cfg.models] == ["flagship", "claude", "medium", "gemini-flash", "small"]
    assert [(e.name, e.api) for e in cfg.endpoints] == [
        ("sim", "openai"),
        ("sim-anthropic", "anthropic"),
        ("sim-vertex", "vertex"),
        ("sim-bedrock", "bedrock"),
        ("sim-gemini", "gemini"),
    ]
    # one model on two deployments, each knowing it by its own id
    claude = next(m for m in cfg.models if m.name == "claude")
    assert [(d.endpoint, d.model) for d in claude.deployed()] == [
        ("sim-anthropic", "sim-claude"),
        ("sim-vertex", "sim-claude-vertex"),
        ("sim-bedrock", "us.anthropic.sim-claude-v1:0"),
    ]
    assert (ROOT / "config.toml").read_text() == bundled_config_path().read_text()


def test_the_simulated_endpoint_works_with_no_key_in_the_environment() -> None:
    keys = resolve_keys(load_config(ROOT / "config.toml"), environ={})
    assert (
        len(keys) == 5
    )  # OpenAI's wire, Anthropic's, Vertex AI's, Bedrock's and the Gemini API's, all on the simulator
    assert {key.secret.reveal() for key in keys.values()} == {SIMULATOR_DEMO_KEY}


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ('[breaker]\ncooldown = "soon"', "breaker.cooldown", "expected a number"),
        ("[breaker]\nfailure_treshold = 3", "breaker.failure_treshold", "did you mean 'failure_threshold'"),
        ("[breaker]\nfailure_threshold = 0", "breaker.failure_threshold", ">= 1"),
        ("[breaker]\nprobe_share = 2", "breaker.probe_share", "<= 1"),
        ("[breaker]\nprobe_floor = -1", "breaker.probe_floor", ">= 0"),
        ("[breaker]\nprobe_flor = 1", "breaker.probe_flor", "did you mean 'probe_floor'"),
        ("[limiter]\nmin = 10\nmax = 5\ninitial = 5", "limiter.min", "at most limiter.max"),
        ("[client]\ndeadline = true", "client.deadline", "expected a number"),
        ("[simulator]\nlisten = 'nowhere'", "simulator.listen", "HOST:PORT"),
        ("models = 3", "models", "list of tables"),
    ],
)
def test_errors_name_the_file_the_key_and_what_was_expected(text: str, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(MINIMAL + "\n" + text if not text.startswith("models") else text, "my.toml")
    message = str(info.value)
    assert message.startswith("my.toml: ")
    assert info.value.key == key
    assert expected in message


def test_a_model_naming_an_unknown_endpoint_gets_the_closest_name() -> None:
    with pytest.raises(
        ConfigError, match=r"models\[0\].endpoints\[0\]: no endpoint named 'opnai'; did you mean 'openai'"
    ):
        parse_config(MINIMAL.replace('endpoints = ["openai"]', 'endpoints = ["opnai"]'), "c.toml")


def test_invalid_toml_names_the_file() -> None:
    with pytest.raises(ConfigError, match=r"^c.toml: not valid TOML"):
        parse_config("[[models]\n", "c.toml")


def test_a_missing_key_variable_is_reported_at_start_without_any_value() -> None:
    cfg = parse_config(MINIMAL, "c.toml")
    with pytest.raises(ConfigError) as info:
        resolve_keys(cfg, environ={})
    assert "OPENAI_API_KEY is not set" in str(info.value)
    assert info.value.key == "endpoints[0].keys[0].env"


def test_secrets_do_not_show_in_repr() -> None:
    cfg = parse_config(MINIMAL, "c.toml")
    keys = resolve_keys(cfg, environ={"OPENAI_API_KEY": "sk-live-secret-123"})
    assert "sk-live-secret-123" not in repr(keys)
    assert "sk-live-secret-123" not in str(list(keys.values())[0].secret)


def test_discovery_order(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(MINIMAL)
    assert find_config("x.toml", {}, tmp_path) == Path("x.toml")
    assert find_config(None, {"CAPMON_CONFIG": "env.toml"}, tmp_path) == Path("env.toml")
    assert find_config(None, {}, tmp_path) == tmp_path / "config.toml"
    empty = tmp_path / "empty"
    empty.mkdir()
    found = find_config(None, {"XDG_CONFIG_HOME": str(tmp_path / "nothing")}, empty)
    assert found in (bundled_config_path(),) or found.name == "config.toml"


@pytest.mark.parametrize(
    "headers,expected",
    [
        ('{ "x-org" = "café" }', None),  # Latin-1: allowed
        ('{ "x-org" = "東京" }', "headers.x-org: expected a header value of printable Latin-1"),
        ('{ "x-org" = "a\\nb" }', "headers.x-org: expected a header value"),
        ('{ "bad name" = "v" }', 'headers."bad name": expected an HTTP header name'),
    ],
)
def test_endpoint_headers_must_be_sendable(headers: str, expected: str | None) -> None:
    text = f"""
[[endpoints]]
name = "ep"
base_url = "http://127.0.0.1:1/v1"
keys = [{{ env = "K" }}]
headers = {headers}

[[models]]
name = "m"
endpoints = ["ep"]
"""
    if expected is None:
        parse_config(text, "h.toml")
        return
    with pytest.raises(ConfigError) as info:
        parse_config(text, "h.toml")
    assert expected in str(info.value) and str(info.value).startswith("h.toml: endpoints[0].headers.")
