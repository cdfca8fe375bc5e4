"""``[shared]`` resolved at start: the Redis URL (from the file or an environment
variable), the way it is shown (never with its password), and the namespace."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from capmon.core.base import secrets
from capmon.core.base.exceptions import CapmonError, ConfigError
from capmon.core.types.config import Config, SharedConfig

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_SCHEMES = ("redis", "rediss", "unix")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class SharedStateUnavailable(CapmonError):
    """``[shared] required = true`` and Redis cannot be reached at start (exit 2)."""


@dataclass(frozen=True)
class Settings:
    config: SharedConfig
    file: str  # the config file, for error messages
    url: str = field(repr=False)  # a secret when it holds a password
    shown: str  # the URL as logs and screens may show it: redis://***@host:port/db

    @property
    def namespace(self) -> str:
        return self.config.namespace


def show_url(url: str) -> str:
    """``url`` without its user and password: ``redis://***@host:6379/0``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "redis://***"
    auth = "***@" if parts.username or parts.password else ""
    if parts.scheme == "unix":
        return f"unix://{auth}{parts.path}"
    return f"{parts.scheme}://{auth}{host}{port}{parts.path}"


def resolve(config: Config, environ: Mapping[str, str] | None = None) -> Settings:
    """Read ``[shared]``'s URL now, so a wrong one is one clear line at start."""
    env = os.environ if environ is None else environ
    sc, file = config.shared, config.path
    if not _NAMESPACE.fullmatch(sc.namespace):
        raise ConfigError(file, "shared.namespace", f"expected 1-64 letters, digits or _ . : -, got {sc.namespace!r}")
    if sc.url and sc.url_env:
        raise ConfigError(file, "shared.url_env", "set url or url_env, not both")
    key = "shared.url"
    url = sc.url
    if sc.url_env:
        key = "shared.url_env"
        if not sc.url_env.replace("_", "").isalnum():
            raise ConfigError(file, key, f"expected an environment variable name, got {sc.url_env!r}")
        url = env.get(sc.url_env, "")
        if not url:
            raise ConfigError(file, key, f"environment variable {sc.url_env} is not set")
    url = url or DEFAULT_URL
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        raise ConfigError(file, key, "expected a URL such as redis://host:6379/0") from None
    if parts.scheme not in _SCHEMES:
        raise ConfigError(file, key, f"expected a redis://, rediss:// or unix:// URL, got {show_url(url)!r}")
    if parts.password:
        secrets.register(parts.password)
        secrets.register(url)
        if not sc.url_env:
            raise ConfigError(
                file, key, "holds a password: put the URL in an environment variable and name it with shared.url_env"
            )
    return Settings(sc, file, url, show_url(url))
