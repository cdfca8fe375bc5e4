"""Configs for tests: three models on one base URL, keys from a fake environment."""

from __future__ import annotations

from capmon.core.config import Config, parse_config

ENV = {"TEST_KEY_A": "sk-test-aaaaaaaaaaaaaaaa", "TEST_KEY_B": "sk-test-bbbbbbbbbbbbbbbb"}


def three_models(base_url: str, *, extra: str = "", keys: str = '[{ env = "TEST_KEY_A", alias = "a" }]',
                 cooldown: float = 300.0, ramp_duration: float = 60.0) -> Config:
    text = f"""
[simulator]
enabled = false

[[endpoints]]
name = "ep"
base_url = "{base_url}"
keys = {keys}

[[models]]
name = "flagship"
endpoints = ["ep"]
context_window = 128000

[[models]]
name = "medium"
endpoints = ["ep"]
context_window = 64000

[[models]]
name = "small"
endpoints = ["ep"]
context_window = 16000

[breaker]
cooldown = {cooldown}
ramp_duration = {ramp_duration}

{extra}
"""
    return parse_config(text, "test.toml")
