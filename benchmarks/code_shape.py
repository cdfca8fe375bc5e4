"""The shape of capmon's code, in figures a refactor is judged by (issue 28's before / after):

* the lines of translation code (what turns one format's bodies, answers and streams into
  another's);
* the modules that name a provider API or a format outside the providers' own modules;
* the size of functions (lines, median and p90) and the largest classes;
* the pairs of places ``duplicates`` reports in capmon/ (when the command is on the PATH).

    python -m benchmarks.code_shape                 # this checkout
    python -m benchmarks.code_shape --root /tmp/old  # another (git archive REV capmon | tar -x -C /tmp/old)

Figures, not a test: it reads files as text and syntax trees, and runs nothing of capmon.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from capmon.core.base.text import percentile, table

ROOT = Path(__file__).resolve().parents[1]

# Where the translations live: the pair translators and the module that pairs formats, and
# (once there is a canonical hub) each format's own module.
TRANSLATION = re.compile(r"(^|/)(translate_[^/]+|formats|chat_format|responses_format|messages_format)\.py$")
# What names a provider API or a format: the enums' members, the wire modules, the pair translators.
NAMING = re.compile(
    r"EndpointApi\.\w+|\b(?:Api|Format)\.(?:CHAT|RESPONSES|MESSAGES)\b|anthropic_wire|openai_wire"
    r"|translate_(?:chat|responses)_anthropic|from capmon\.core import [^\n]*\bwire\b|capmon\.core\.wire\b"
)
# The providers' own modules, before the core's rooms (flat in capmon/core) and after.
PROVIDERS = re.compile(
    r"(^|/)(core/providers/|core/anthropic_wire\.py$|core/wire\.py$|core/translate_[^/]+\.py$|core/formats\.py$)"
)


@dataclass(frozen=True)
class Shape:
    translation_lines: int
    naming_modules: list[str]
    function_lines: list[int]
    classes: list[tuple[int, str]]
    duplicates: str


def _code_lines(text: str) -> int:
    """Lines that are neither blank nor only a comment (docstrings count: they are part of the code's size)."""
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def measure(root: Path) -> Shape:
    package = root / "capmon"
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    translation = 0
    naming: list[str] = []
    functions: list[int] = []
    classes: list[tuple[int, str]] = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        if TRANSLATION.search(rel) and "/core/" in rel:
            translation += _code_lines(text)
        if not PROVIDERS.search(rel) and NAMING.search(text):
            naming.append(rel)
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                functions.append(node.end_lineno - node.lineno + 1)
            elif isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                classes.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
    dup = ""
    if shutil.which("duplicates"):
        out = subprocess.run(
            ["duplicates", "--seconds", "120"], cwd=package, capture_output=True, text=True, check=False
        ).stdout
        dup = out.splitlines()[0] if out else ""
    return Shape(translation, naming, functions, sorted(classes, reverse=True)[:8], dup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="a checkout's root (default: this one)")
    args = parser.parse_args()
    s = measure(args.root)
    sizes = sorted(s.function_lines)
    print(f"capmon at {args.root}")
    print(f"translation code (core): {s.translation_lines} lines")
    print(f"modules naming a provider API or format outside the providers' own: {len(s.naming_modules)}")
    for name in s.naming_modules:
        print(f"  {name}")
    print(
        f"functions: {len(sizes)}, lines median {statistics.median(sizes):.0f}, "
        f"p90 {percentile(sizes, 0.9):.0f}, max {sizes[-1]}"
    )
    print("largest classes:")
    print("\n".join("  " + line for line in table([("lines", "class"), *((str(n), c) for n, c in s.classes)])))
    print(f"duplicates in capmon/: {s.duplicates or 'the duplicates command is not on the PATH'}")


if __name__ == "__main__":
    main()
