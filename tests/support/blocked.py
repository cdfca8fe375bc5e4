"""capmon in a fresh interpreter as if some packages were not installed (an extra left out).

A finder first on ``sys.meta_path`` refuses the blocked top-level packages as a missing
module is refused (ModuleNotFoundError naming it): what ``pip install capmon`` without
an extra gives, without building a venv per case. The packages must not be imported
already when it goes in (nothing imports them at the interpreter's start); the script
checks that, and prints which of them got loaded anyway at its end (there is no way
around the finder, so that is ``[]`` unless something caught the error and went on).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What the core install does not bring: the packages of every extra but the core's own
# (h11 is httpcore's, so it is there with httpx).
NOT_IN_THE_CORE = (
    "starlette",
    "uvicorn",
    "httptools",
    "prometheus_client",
    "redis",
    "psycopg",
    "opentelemetry",
    "aiohttp",
    "httpx_aiohttp",
    "uvloop",
)

_BLOCKER = """
import importlib.abc, sys
_BLOCKED = frozenset(sys.argv.pop(1).split(","))
_loaded = sorted(n for n in sys.modules if n.partition(".")[0] in _BLOCKED)
assert not _loaded, f"imported before the blocker: {_loaded}"

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""

_LOADED = """
import atexit
atexit.register(lambda: print("blocked-but-loaded:", sorted(n for n in sys.modules if n.partition(".")[0] in _BLOCKED)))
"""


def script(code: str) -> str:
    """``code`` behind the blocker; the blocked names are the process's first argument."""
    return _BLOCKER + _LOADED + code


# The command line, as the console script runs it.
CLI = "from capmon.cli import main\nsys.exit(main(sys.argv[1:]))"


def command(blocked: Iterable[str], code: str, *args: str) -> list[str]:
    """A fresh interpreter running ``code`` behind the blocker, ``args`` its sys.argv[1:]."""
    return [sys.executable, "-c", script(code), ",".join(blocked), *args]


def run_without(
    blocked: Iterable[str],
    code: str,
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (after the blocker) in a fresh interpreter with ``args`` as sys.argv[1:]."""
    return subprocess.run(
        command(blocked, code, *args),
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )


def capmon_without(
    blocked: Iterable[str], argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The command line (capmon.cli.main) in a fresh interpreter without ``blocked``."""
    return run_without(blocked, CLI, *argv, cwd=cwd, env=env)


def loaded_anyway(output: str) -> str:
    """The script's last words: which blocked packages were loaded anyway (``[]``). Found
    anywhere on its line: on a terminal, after what the screen left there."""
    found = re.findall(r"blocked-but-loaded: (\[[^\]]*\])", output)
    assert found, output[-2000:]
    return str(found[-1])
