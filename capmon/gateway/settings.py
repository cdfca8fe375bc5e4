"""The gateway's settings: the config's ``[gateway]`` table checked against its models,
with the client keys and the admin key read from their environment variables.

Every error names the config file and the key (``gateway.aliases.gpt-5``,
``gateway.aliases."claude-*"``), as the rest of capmon does; a key's value never appears in
one. An alias's name may be a pattern (capmon/gateway/models.py); its target is checked as
any alias's.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from capmon.core.base.exceptions import ConfigError
from capmon.core.base.extras import Extra, require
from capmon.core.base.schema import key_text
from capmon.core.base.secrets import MIN_SECRET_CHARS, Secret
from capmon.core.types.config import Config, parse_listen
from capmon.core.types.result import Priority
from capmon.gateway.shape import BodyLimits

AUTO = "auto"  # the built-in alias: the config's preference order
# prometheus_client reads it when it is imported: each worker's counters go to files there,
# which every worker's /metrics adds up (the supervisor makes the directory).
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True)
class ClientKey:
    alias: str
    priority: Priority
    secret: Secret = field(repr=False, compare=False)


@dataclass(frozen=True)
class GatewaySettings:
    host: str
    port: int
    keys: tuple[ClientKey, ...]
    admin: Secret | None = field(repr=False, compare=False)
    aliases: Mapping[str, str | None]  # what a client may send as "model" -> a model (None: the preference order)
    models: tuple[str, ...]
    max_body_bytes: int
    body_limits: BodyLimits  # [gateway] max_messages, max_content_blocks, max_tools
    header_timeout: float = 10.0  # seconds to send a request's complete headers
    keep_alive_timeout: float = 15.0  # seconds an idle connection stays open between requests
    write_timeout: float = 30.0  # seconds an answer's bytes may stay untaken before it is cancelled
    max_connections: int = 1000  # open client connections at most
    cors_origins: tuple[str, ...] = ()  # browser origins allowed (CORS); every other Origin is refused
    access_log: str = ""  # a file for one JSON line per request, "-" for stderr; "": none
    workers: int = 1  # processes serving the port (capmon/gateway/workers.py)
    http: str = "httptools"  # the HTTP/1.1 parser (capmon/gateway/connections.py)
    loop: str = "asyncio"  # the event loop
    worker: int | None = None  # this process's number when it is one worker of several
    metrics_dir: str = ""  # a worker's: where every worker's counters live (prometheus_client's multiprocess mode)

    @property
    def listen(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def open(self) -> bool:
        """No client keys: anyone who can reach the gateway may use it (loopback only)."""
        return not self.keys


def _secret(cfg: Config, key: str, env_name: str, environ: Mapping[str, str], alias: str) -> Secret:
    if not env_name or not env_name.replace("_", "").isalnum():
        raise ConfigError(cfg.path, key, f"expected an environment variable name, got {env_name!r}")
    value = environ.get(env_name, "")
    if not value:
        raise ConfigError(cfg.path, key, f"environment variable {env_name} is not set")
    if len(value) < MIN_SECRET_CHARS:
        raise ConfigError(
            cfg.path,
            key,
            f"the key in {env_name} is {len(value)} characters long; expected at least {MIN_SECRET_CHARS}",
        )
    return Secret(value, alias)


_ORIGIN = re.compile(r"(https?)://([a-z0-9.-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?")


def _origins(cfg: Config) -> tuple[str, ...]:
    """Each origin as a browser sends it in ``Origin`` (scheme://host[:port], lower case, no
    path): an explicit list, never a wildcard, so no page the operator did not name gets in."""
    out: list[str] = []
    for i, origin in enumerate(cfg.gateway.cors_origins):
        text = origin.strip().lower()
        if not _ORIGIN.fullmatch(text):
            raise ConfigError(
                cfg.path,
                f"gateway.cors_origins[{i}]",
                f"expected an origin such as http://localhost:3000 (scheme://host[:port], no path, "
                f"no wildcard), got {origin!r}",
            )
        out.append(text)
    return tuple(dict.fromkeys(out))


def _aliases(cfg: Config) -> dict[str, str | None]:
    models = [m.name for m in cfg.models]
    out: dict[str, str | None] = {AUTO: None}
    for name, target in cfg.gateway.aliases.items():
        where = f"gateway.aliases.{key_text(name)}"
        if not name or not name.isprintable():
            raise ConfigError(cfg.path, where, "expected a name without control characters")
        if name == AUTO:
            raise ConfigError(cfg.path, where, "'auto' is built in (the preference order); choose another name")
        if name in models:  # a pattern may match a model's name: the model wins (capmon/gateway/models.py)
            raise ConfigError(cfg.path, where, "is already the name of a model; an alias needs a name of its own")
        if target != AUTO and target not in models:
            close = difflib.get_close_matches(target, models, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                cfg.path, where, f"no model named {target!r}{hint}; expected one of {', '.join(models)} or auto"
            )
        out[name] = None if target == AUTO else target
    return out


def load_settings(
    cfg: Config,
    *,
    listen: str | None = None,
    environ: Mapping[str, str] | None = None,
    access_log: str | None = None,
    workers: int | None = None,
    loop: str | None = None,
    worker: int | None = None,
) -> GatewaySettings:
    """The gateway's settings from ``cfg`` (``listen`` overrides ``[gateway] listen``,
    ``access_log`` ``[gateway] access_log``, ``workers`` and ``loop`` theirs; ``worker``:
    this process is that worker of several).
    Raises ConfigError naming the file and key."""
    env = os.environ if environ is None else environ
    g = cfg.gateway
    where = "gateway.listen"
    text = listen if listen is not None else g.listen
    try:
        parsed = parse_listen(text)  # port 0: any free port (tests); the config's own port must be fixed
        if listen is None:
            parse_listen(text, fixed=True)
    except ValueError:
        detail = f"expected HOST:PORT such as 127.0.0.1:4000, got {text!r}"
        raise (
            ConfigError("--listen", "", detail) if listen is not None else ConfigError(cfg.path, where, detail)
        ) from None
    keys: list[ClientKey] = []
    seen_alias: set[str] = set()
    seen_value: set[str] = set()
    for i, k in enumerate(g.keys):
        alias = k.alias or k.env
        if not alias.isprintable():
            raise ConfigError(
                cfg.path, f"gateway.keys[{i}].alias", f"expected a name without control characters, got {alias!r}"
            )
        if alias in seen_alias:
            raise ConfigError(cfg.path, f"gateway.keys[{i}].alias", f"duplicate key alias {alias!r}")
        seen_alias.add(alias)
        secret = _secret(cfg, f"gateway.keys[{i}].env", k.env, env, alias)
        if secret.reveal() in seen_value:
            raise ConfigError(
                cfg.path,
                f"gateway.keys[{i}].env",
                f"{k.env} holds the same key as another client key; each key needs a value of its own",
            )
        seen_value.add(secret.reveal())
        keys.append(ClientKey(alias, Priority(k.priority), secret))
    admin = None
    if g.admin_key_env:
        admin = _secret(cfg, "gateway.admin_key_env", g.admin_key_env, env, "admin")
        if admin.reveal() in seen_value:
            raise ConfigError(
                cfg.path,
                "gateway.admin_key_env",
                f"{g.admin_key_env} holds the same key as a client key; the admin key needs a value of its own",
            )
    return GatewaySettings(
        host=parsed[0],
        port=parsed[1],
        keys=tuple(keys),
        admin=admin,
        aliases=_aliases(cfg),
        models=tuple(m.name for m in cfg.models),
        max_body_bytes=g.max_body_bytes,
        body_limits=BodyLimits(messages=g.max_messages, content_blocks=g.max_content_blocks, tools=g.max_tools),
        header_timeout=g.header_timeout,
        keep_alive_timeout=g.keep_alive_timeout,
        write_timeout=g.write_timeout,
        max_connections=g.max_connections,
        cors_origins=_origins(cfg),
        access_log=access_log if access_log is not None else g.access_log,
        workers=_workers(cfg, workers),
        http=g.http,
        loop=_loop(cfg, loop),
        worker=worker,
        metrics_dir=env.get(METRICS_DIR_ENV, "") if worker is not None else "",
    )


def _workers(cfg: Config, asked: int | None) -> int:
    n = asked if asked is not None else cfg.gateway.workers
    where = ("--workers", "") if asked is not None else (cfg.path, "gateway.workers")
    if not 1 <= n <= 64:
        raise ConfigError(*where, f"expected a number of processes from 1 to 64, got {n}")
    if n > 1 and cfg.shared.backend != "redis":
        # Each worker is a process with its own client: only a shared state makes them one.
        raise ConfigError(
            cfg.path,
            "shared.backend",
            f"{n} gateway workers (gateway.workers or --workers) share one client's state only through "
            f'Redis: set [shared] backend = "redis" and its url, or serve with one worker',
        )
    return n


def _loop(cfg: Config, asked: str | None) -> str:
    loop = asked if asked is not None else cfg.gateway.loop
    where = ("--loop", "") if asked is not None else (cfg.path, "gateway.loop")
    if loop not in ("asyncio", "uvloop"):
        raise ConfigError(*where, f"expected asyncio or uvloop, got {loop!r}")
    if loop == "uvloop":
        require(Extra.UVLOOP, "--loop uvloop" if asked is not None else f'{cfg.path}: gateway.loop = "uvloop"')
    return loop
