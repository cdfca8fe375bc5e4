"""capmon's optional parts (the extras of pyproject.toml) and the one place that says one
is missing.

``pip install capmon`` brings the library and the dashboard only. What needs more says
so where it is asked for, before anything starts: :func:`require` raises
:class:`~capmon.core.base.exceptions.MissingExtra` (one line naming the extra and the command
that installs it; exit 2 on the command line), and :func:`installed` lets a default
choose what is there (``client.transport = "auto"``).
"""

from __future__ import annotations

import enum
import importlib

from capmon.core.base.exceptions import MissingExtra


class Extra(enum.StrEnum):
    """An extra of pyproject.toml's ``[project.optional-dependencies]``, by its name."""

    SIM = "sim"  # the simulated provider: capmon sim, [simulator] enabled = true
    GATEWAY = "gateway"  # capmon serve, and the in-process SDK clients (capmon/inprocess)
    FLEET = "fleet"  # [shared] backend = "redis" (capmon/fleet)
    POSTGRES = "postgres"  # a job store in PostgreSQL (--db postgresql://...)
    OTEL = "otel"  # the gateway's traces ([telemetry] otlp_endpoint)
    AIOHTTP = "aiohttp"  # client.transport = "aiohttp" (capmon/core/routing/transport_aiohttp.py)
    UVLOOP = "uvloop"  # [gateway] loop = "uvloop"
    GOOGLE = "google"  # api = "vertex" without keys: google-auth's credentials (capmon/core/providers/google_auth.py)
    AWS = "aws"  # api = "bedrock": SigV4 and the event stream's decoder (botocore)


# The modules each extra's code imports: importing them all is what "installed" means
# (a package there whose own dependency is not, or psycopg without its libpq, is missing).
MODULES: dict[Extra, tuple[str, ...]] = {
    Extra.SIM: ("starlette", "uvicorn"),
    Extra.GATEWAY: ("starlette", "uvicorn", "httptools", "h11", "prometheus_client"),
    Extra.FLEET: ("redis.asyncio",),
    Extra.POSTGRES: ("psycopg",),
    Extra.OTEL: ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
    Extra.AIOHTTP: ("aiohttp", "httpx_aiohttp"),
    Extra.UVLOOP: ("uvloop",),
    Extra.GOOGLE: ("google.auth", "google.auth.transport.requests", "google.oauth2.service_account"),
    Extra.AWS: ("botocore.auth", "botocore.eventstream"),
}


def _missing(extra: Extra) -> str | None:
    """The first of the extra's modules that cannot be imported (its name), or None."""
    for name in MODULES[extra]:
        try:
            importlib.import_module(name)
        except ImportError as e:
            return e.name or name
    return None


def installed(extra: Extra) -> bool:
    """Whether everything ``extra`` brings can be imported (importing it)."""
    return _missing(extra) is None


def require(extra: Extra, what: str) -> None:
    """Raise MissingExtra (``{what} needs the {extra} extra: pip install 'capmon[{extra}]'``)
    unless ``extra`` is installed. ``what``: the command, or the config's file and setting,
    that asks for it, as a person would type it."""
    module = _missing(extra)
    if module is not None:
        raise MissingExtra(what, extra.value, module)
