"""The layers hold: the core imports neither the gateway nor its web stack, the gateway
needs no dashboard, and `pip install 'capmon[gateway]'` is all it needs (checked in fresh
interpreters, with the forbidden modules made unimportable)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.blocked import loaded_anyway, run_without

CORE = """
import sys
for name in ("starlette", "uvicorn", "prometheus_client", "capmon.gateway"):
    sys.modules[name] = None  # any import of these now raises ImportError
import importlib, pkgutil, capmon.core
for m in pkgutil.walk_packages(capmon.core.__path__, "capmon.core."):
    importlib.import_module(m.name)
print("ok")
"""

GATEWAY = """
import sys
for name in ("textual", "rich", "capmon.tui", "capmon.batch"):
    sys.modules[name] = None
import importlib, pkgutil, capmon.gateway
for m in pkgutil.walk_packages(capmon.gateway.__path__, "capmon.gateway."):
    importlib.import_module(m.name)
print(len([n for n in sys.modules if n.startswith("capmon.gateway.")]))
"""


def test_the_core_imports_without_the_gateway_or_its_web_stack() -> None:
    out = subprocess.run([sys.executable, "-c", CORE], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_gateway_needs_no_dashboard() -> None:
    out = subprocess.run([sys.executable, "-c", GATEWAY], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) >= 15


# The gateway and the in-process SDK clients on the gateway extra alone: every other
# extra's packages refused (the traces' modules are the otel extra's: imported only when
# [telemetry] asks, capmon/gateway/telemetry.py).
GATEWAY_EXTRA = """
import importlib, pkgutil
for package in ("capmon.gateway", "capmon.inprocess"):
    for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if m.name not in ("capmon.gateway.traces", "capmon.gateway.trace_relay", "capmon.gateway.relay_process"):
            importlib.import_module(m.name)
import capmon.gateway.serve, capmon.serving, capmon.sim.server
print(len([n for n in sys.modules if n.startswith(("capmon.gateway.", "capmon.inprocess."))]))
"""


def test_the_gateway_needs_only_the_gateway_extra() -> None:
    others = ("redis", "psycopg", "opentelemetry", "aiohttp", "httpx_aiohttp", "uvloop")
    out = run_without(others, GATEWAY_EXTRA)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.splitlines()[0]) >= 20
    assert loaded_anyway(out.stdout) == "[]"
