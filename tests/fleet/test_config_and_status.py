"""``[shared]`` in the config, the URL it names (never shown with its password), and the
fleet's status on the snapshot: "off" for one process in memory, through JSON and back."""

from __future__ import annotations

import dataclasses

import pytest

from capmon.core.base.clock import default_clock
from capmon.core.base.exceptions import ConfigError
from capmon.core.base.secrets import redact
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import Config, parse_config
from capmon.core.types.serial import snapshot_from_json, snapshot_to_json
from capmon.core.types.snapshot import FleetProcess, LinkState, SharedStatus
from capmon.fleet import shared_state, show_url
from capmon.fleet.settings import resolve
from tests.support.configs import ENV, config_toml

BASE = config_toml("http://127.0.0.1:9/v1", models=["m"])


def _config(shared: str) -> Config:
    return parse_config(BASE + "\n[shared]\n" + shared, "c.toml")


def test_memory_is_the_default_and_its_status_is_off() -> None:
    cfg = parse_config(BASE, "c.toml")
    assert cfg.shared.backend == "memory" and cfg.shared.namespace == "capmon" and not cfg.shared.required
    assert (cfg.shared.lease_ttl, cfg.shared.heartbeat, cfg.shared.reconcile) == (5.0, 1.0, 1.0)
    snap = FallbackClient(cfg, environ=ENV).snapshot()
    assert snap.shared == SharedStatus() and snap.shared.state is LinkState.OFF
    assert snap.shared.label == "shared state: off"


def test_the_shared_status_goes_through_json_and_back() -> None:
    cfg = parse_config(BASE, "c.toml")
    snap = FallbackClient(cfg, environ=ENV).snapshot()
    status = SharedStatus(
        backend="redis",
        state=LinkState.DEGRADED,
        since=1.5,
        message="lost",
        url="redis://h:1/0",
        namespace="n",
        processes=(FleetProcess("h:1:ab", "h", 1, "gateway", 3, 1.0, 2.0, True, True),),
    )
    back = snapshot_from_json(snapshot_to_json(dataclasses.replace(snap, shared=status)))
    assert back.shared == status


@pytest.mark.parametrize(
    ("shared", "key", "message"),
    [
        ('backend = "etcd"', "shared.backend", "expected one of memory, redis, got 'etcd'"),
        ('backend = "redis"\nlease_tl = 5', "shared.lease_tl", "unknown key; did you mean 'lease_ttl'?"),
        ('backend = "redis"\nlease_ttl = 0', "shared.lease_ttl", "expected a number >= 0.05, got 0"),
    ],
)
def test_a_wrong_shared_section_names_the_file_and_key(shared: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _config(shared)
    assert str(info.value) == f"c.toml: {key}: {message}"


@pytest.mark.parametrize(
    ("shared", "environ", "key", "message"),
    [
        (
            'backend = "redis"\nurl_env = "NO_SUCH_VAR"',
            {},
            "shared.url_env",
            "environment variable NO_SUCH_VAR is not set",
        ),
        (
            'backend = "redis"\nurl = "redis://:sekrit-pass@h:6379/0"',
            {},
            "shared.url",
            "holds a password: put the URL in an environment variable and name it with shared.url_env",
        ),
        (
            'backend = "redis"\nurl = "http://h:6379"',
            {},
            "shared.url",
            "expected a redis://, rediss:// or unix:// URL, got 'http://h:6379'",
        ),
        (
            'backend = "redis"\nurl = "redis://a"\nurl_env = "X"',
            {"X": "redis://b"},
            "shared.url_env",
            "set url or url_env, not both",
        ),
        (
            'backend = "redis"\nnamespace = "a b"',
            {},
            "shared.namespace",
            "expected 1-64 letters, digits or _ . : -, got 'a b'",
        ),
    ],
)
def test_a_wrong_url_or_namespace_is_one_clear_line(
    shared: str, environ: dict[str, str], key: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(_config(shared), environ)
    assert str(info.value) == f"c.toml: {key}: {message}"
    assert "sekrit" not in str(info.value)


def test_a_url_from_the_environment_is_shown_without_its_password() -> None:
    s = resolve(_config('backend = "redis"\nurl_env = "R"'), {"R": "redis://user:sekrit-pass@db.example:6380/2"})
    assert s.shown == "redis://***@db.example:6380/2" and "sekrit" not in repr(s)
    assert show_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert resolve(_config('backend = "redis"'), {}).url == "redis://127.0.0.1:6379/0"  # the default
    assert "sekrit" not in redact("connecting to redis://user:sekrit-pass@db.example:6380/2 failed")


def test_the_role_is_one_of_the_known_ones() -> None:
    with pytest.raises(ValueError, match="role must be one of gateway, batch, dashboard, library"):
        shared_state(_config('backend = "redis"'), clock=default_clock(), publish=lambda e: None, role="robot")
