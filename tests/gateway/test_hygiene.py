"""The layers hold: the core imports neither the gateway nor its web stack, and the
gateway needs no dashboard (checked in fresh interpreters, with the forbidden modules
made unimportable)."""

from __future__ import annotations

import subprocess
import sys

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
