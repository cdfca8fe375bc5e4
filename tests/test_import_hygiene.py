"""The core never imports the dashboard, nor Textual or Rich.

httpx imports Rich for its own command line whenever Rich is installed (and it is,
for Textual), so the check blocks Rich and Textual outright in a fresh interpreter:
if any core module needed them, importing it would fail.
"""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
for name in ("textual", "rich", "capmon.tui"):
    sys.modules[name] = None  # any import of these now raises ImportError
import importlib, pkgutil, capmon.core
for m in pkgutil.walk_packages(capmon.core.__path__, "capmon.core."):
    importlib.import_module(m.name)
for extra in ("capmon.sim", "capmon.sim.app", "capmon.sim.server", "capmon.batch", "capmon.batch.runner",
              "capmon.batch.commands", "capmon.audit", "capmon.report", "capmon.advice", "capmon.probe",
              "capmon.status", "capmon.runtime"):
    try:
        importlib.import_module(extra)
    except ModuleNotFoundError as e:
        if e.name != extra:
            raise
loaded = sorted(n for n in sys.modules if n.startswith("capmon."))
print(len(loaded))
"""


def test_the_core_imports_without_textual_or_rich() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) >= 10


CORE_WITHOUT_WEB = """
import sys
for name in ("starlette", "uvicorn", "prometheus_client", "opentelemetry", "capmon.gateway", "capmon.serving",
             "capmon.fleet"):
    sys.modules[name] = None  # any import of these now raises ImportError
import importlib, pkgutil, capmon, capmon.core
for m in pkgutil.walk_packages(capmon.core.__path__, "capmon.core."):
    importlib.import_module(m.name)
print("ok")
"""


def test_the_core_imports_without_the_web_server_the_gateway_or_the_fleet() -> None:
    out = subprocess.run([sys.executable, "-c", CORE_WITHOUT_WEB], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_the_core_does_not_pull_in_the_dashboard() -> None:
    code = (
        "import sys, capmon.core.router, capmon.core.config; "
        "print([n for n in sys.modules if n.startswith(('textual', 'capmon.tui'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
