"""The core never imports the dashboard, nor Textual or Rich.

httpx imports Rich for its own command line whenever Rich is installed (and it is,
for Textual), so the check blocks Rich and Textual outright in a fresh interpreter:
if any core module needed them, importing it would fail.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

from tests.support.blocked import NOT_IN_THE_CORE, loaded_anyway, run_without

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


# What `pip install capmon` (no extra) runs: the library, the dashboard (local or --connect),
# batch jobs in SQLite, reports, status, the simulator's scenarios (`capmon sim --list`).
CORE_INSTALL = """
import importlib, pkgutil
import capmon
for package in ("capmon.core", "capmon.tui", "capmon.batch"):
    for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if m.name not in ("capmon.core.routing.transport_aiohttp", "capmon.batch.pg"):  # the aiohttp, postgres extras
            importlib.import_module(m.name)
for name in ("capmon.cli", "capmon.runtime", "capmon.status", "capmon.connect", "capmon.report", "capmon.advice",
             "capmon.audit", "capmon.probe", "capmon.sim", "capmon.sim.command", "capmon.exitcodes"):
    importlib.import_module(name)
print(len([n for n in sys.modules if n.startswith("capmon.")]))
"""


def test_the_library_and_the_dashboard_import_with_no_extra_installed() -> None:
    # The packages of every extra refused as if not installed (tests/support/blocked.py);
    # tests/test_extras.py runs the dashboard itself so, and each missing extra's one line.
    out = run_without(NOT_IN_THE_CORE, CORE_INSTALL)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.splitlines()[0]) >= 100
    assert loaded_anyway(out.stdout) == "[]"


def test_the_core_does_not_pull_in_the_dashboard() -> None:
    code = (
        "import sys, capmon.core.routing.client, capmon.core.types.config; "
        "print([n for n in sys.modules if n.startswith(('textual', 'capmon.tui'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- the layers, as ARCHITECTURE.md draws them

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "capmon"
UNLAYERED = {"__init__", "exitcodes"}  # outside the order: the public API and the exit codes (ARCHITECTURE.md)


def _layers() -> dict[str, int]:
    """Each top-level part of capmon (``cli``, ``tui``, ``report``...) and its line in the
    block under "## Layers", 0 at the top; the parts named on one line share it."""
    block = (ROOT / "ARCHITECTURE.md").read_text().split("## Layers", 1)[1].split("```", 2)[1]
    heads = [re.split(r"\s{2,}", line)[0] for line in block.splitlines() if line.startswith("capmon/")]
    return {
        name: level
        for level, head in enumerate(heads)
        for name in re.findall(r"([a-z_]+)(?:\.py\b|/)", head.removeprefix("capmon/"))
    }


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


@functools.cache  # parsing capmon takes a second or two: once for every test here
def _imported(path: Path) -> frozenset[str]:
    """Every module ``path`` imports, at its top or inside a function, and its ``from`` names."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return frozenset(out)


def _parts_imported(path: Path) -> set[str]:
    out = set()
    for name in _imported(path):
        parts = name.split(".")
        if parts[0] == "capmon" and len(parts) > 1:
            if (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file():
                out.add(parts[1])
    return out


def test_architecture_md_draws_every_part_of_capmon() -> None:
    parts = {_part(p) for p in PACKAGE.rglob("*.py")}
    assert parts - UNLAYERED == set(_layers())


def test_each_layer_imports_only_the_layers_below_it() -> None:
    levels = _layers()
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = _part(path)
        if part in UNLAYERED or path.name == "__main__.py":  # entry points stand above every layer
            continue
        for other in sorted(_parts_imported(path) - UNLAYERED - {part}):
            if levels[other] < levels[part]:
                wrong.append(f"{path.relative_to(ROOT)} imports capmon.{other}, a layer above it")
    assert wrong == []


def test_only_the_command_line_sees_argparse() -> None:
    seen = [
        str(p.relative_to(ROOT))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "cli.py" and any(n.split(".")[0] == "argparse" for n in _imported(p))
    ]
    assert seen == []


# ---------------------------------------------------------------- the core's rooms, as ARCHITECTURE.md draws them

CORE = PACKAGE / "core"


def _rooms() -> dict[str, int]:
    """Each room of the core and its line in the block under "## The core, room by room", 0 at the top."""
    block = (ROOT / "ARCHITECTURE.md").read_text().split("## The core, room by room", 1)[1].split("```", 2)[1]
    heads = [line.split()[0] for line in block.splitlines() if line.startswith("capmon/core/")]
    return {head.removeprefix("capmon/core/").strip("/"): level for level, head in enumerate(heads)}


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``: imports that run nothing."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for n in ast.walk(node)}
    return out


def test_architecture_md_draws_every_room_of_the_core() -> None:
    rooms = {p.relative_to(CORE).parts[0] for p in CORE.rglob("*.py") if p.parent != CORE}
    assert rooms == set(_rooms())
    assert [p.name for p in CORE.glob("*.py")] == ["__init__.py"]  # every module is in a room


def test_each_room_of_the_core_imports_only_itself_and_the_rooms_below_it() -> None:
    levels = _rooms()
    wrong = []
    for path in sorted(CORE.rglob("*.py")):
        if path.parent == CORE:
            continue
        room = path.relative_to(CORE).parts[0]
        tree = ast.parse(path.read_text())
        typing_only = _type_checking_only(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.module or id(node) in typing_only:
                continue
            parts = node.module.split(".")
            if parts[:2] == ["capmon", "core"] and len(parts) > 2 and levels[parts[2]] < levels[room]:
                wrong.append(f"{path.relative_to(ROOT)} imports {node.module}, a room above {room}")
    assert wrong == []
