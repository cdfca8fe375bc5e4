"""`[gateway]` checked against the models, with its keys from the environment: every
mistake names the file and the key, never a key's value."""

from __future__ import annotations

import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.types.result import Priority
from capmon.gateway.settings import load_settings
from capmon.gateway.shape import BodyLimits
from tests.gateway.helpers import config

ENV = {"A": "sk-client-aaaaaaaaaaaa", "B": "sk-client-bbbbbbbbbbbb", "ADMIN": "sk-admin-cccccccccccc", "SHORT": "abc"}


def settings(gateway: str, **kw: object) -> object:
    return load_settings(config("http://127.0.0.1:9/v1", gateway=gateway), environ=ENV, **kw)  # type: ignore[arg-type]


def test_a_full_gateway_table() -> None:
    s = load_settings(
        config(
            "http://127.0.0.1:9/v1",
            gateway='listen = "[::1]:4100"\n'
            'keys = [{ env = "A", alias = "team" }, { env = "B", priority = "batch" }]\n'
            'admin_key_env = "ADMIN"\naliases = { "gpt-5" = "flagship", "default" = "auto" }',
        ),
        environ=ENV,
    )
    assert (s.host, s.port, s.listen) == ("::1", 4100, "[::1]:4100")
    assert [(k.alias, k.priority) for k in s.keys] == [("team", Priority.INTERACTIVE), ("B", Priority.BATCH)]
    assert s.aliases == {"auto": None, "gpt-5": "flagship", "default": None} and s.admin is not None
    assert "sk-" not in repr(s)  # keys are Secrets: their repr shows the alias only
    assert s.body_limits == BodyLimits(messages=5_000, content_blocks=10_000, tools=1_000)  # the defaults
    limits = settings("max_messages = 7\nmax_content_blocks = 8\nmax_tools = 9").body_limits  # type: ignore[attr-defined]
    assert limits == BodyLimits(messages=7, content_blocks=8, tools=9)
    assert settings("", listen="127.0.0.1:0").port == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "gateway, key, message",
    [
        ('aliases = { "flagship" = "small" }', "gateway.aliases.flagship", "is already the name of a model"),
        ('aliases = { "" = "small" }', 'gateway.aliases.""', "expected a name"),
        # a pattern's target is checked as any alias's: a configured model or auto
        ('aliases = { "claude-*" = "claud" }', 'gateway.aliases."claude-*"', "no model named 'claud'"),
        ('aliases = { "gpt-?" = "flagshp" }', 'gateway.aliases."gpt-?"', "did you mean 'flagship'?"),
        ('aliases = { "o[34]*" = "" }', 'gateway.aliases."o[34]*"', "expected one of flagship, medium, small or auto"),
        (
            'keys = [{ env = "A", alias = "x" }, { env = "B", alias = "x" }]',
            "gateway.keys[1].alias",
            "duplicate key alias",
        ),
        ('keys = [{ env = "A" }, { env = "A", alias = "again" }]', "gateway.keys[1].env", "holds the same key"),
        ('keys = [{ env = "A" }]\nadmin_key_env = "A"', "gateway.admin_key_env", "holds the same key as a client key"),
        ('keys = [{ env = "SHORT" }]', "gateway.keys[0].env", "3 characters long; expected at least 8"),
        ('keys = [{ env = "not a name" }]', "gateway.keys[0].env", "expected an environment variable name"),
        ('listen = "4000"', "gateway.listen", "expected HOST:PORT"),
        ("max_body_bytes = 10", "gateway.max_body_bytes", "expected a whole number >= 1024"),
        ("max_messages = 0", "gateway.max_messages", "expected a whole number >= 1, got 0"),
        ("max_content_blocks = 2.5", "gateway.max_content_blocks", "expected a whole number, got 2.5"),
        ('max_tools = "many"', "gateway.max_tools", "expected a whole number, got 'many'"),
        ("max_content_block = 5", "gateway.max_content_block", "did you mean 'max_content_blocks'?"),
    ],
)
def test_mistakes_name_the_file_and_the_key(gateway: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(gateway)
    assert info.value.file == "gateway-test.toml" and info.value.key == key and message in info.value.detail
    assert "abc" not in str(info.value) and "sk-client" not in str(info.value)
