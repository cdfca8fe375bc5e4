"""The shape of capmon's code, in figures a refactor is judged by (issue 28's before / after):

* the lines of translation code (what turns one format's bodies, answers and streams into
  another's);
* the modules that name a provider API or a format outside the providers' own modules;
* the size of functions (lines, median and p90) and the largest classes;
* the pairs of places ``duplicates`` reports in capmon/ (when the command is on the PATH).

    python -m benchmarks.code_shape                 # this checkout
    python -m benchmarks.code_shape --root /tmp/old  # another (git archive REV capmon | tar -x -C /tmp/old)

What counts, in every layout the code has had:

* translation code: the pair translators (``translate_*.py``), ``formats.py`` (which pairs a
  caller's format with a target's wire) and ``hub.py`` (the canonical hub's moves) whole, and of
  each format module (``*_format.py``) its "requests" and "answers and streams" sections only
  (from its ``# ==== requests`` line to its ``# ==== reading and probing`` line; a format module
  without those lines counts whole). A format module's "reading and probing" section (parsing
  its own answers and frames, its probe and its body, once ``openai_wire.py`` /
  ``anthropic_wire.py``) reads one wire and translates nothing, so it is not counted;
* a module names a provider API or a format when its text names an enum member
  (``EndpointApi.X``, ``Format.CHAT``...), an old wire module or a pair translator, or when it
  imports a format's or a dialect's module or their registries (``chat_format``,
  ``responses_format``, ``messages_format``, ``*_dialect``, ``hub``, ``dialect``): either way it
  knows more of the providers than the composed API (``formats.py``) says. Each module is listed
  with what it names.

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

# Where the translations live: the pair translators, the module that pairs formats, the hub, and
# each format's own module (only its translating sections: see FORMAT_MODULE and _translation_lines).
TRANSLATION = re.compile(r"(^|/)(translate_[^/]+|formats|hub|chat_format|responses_format|messages_format)\.py$")
FORMAT_MODULE = re.compile(r"(^|/)\w+_format\.py$")
# A format module's sections, each opened by a line "# ===... <name>".
SECTION = re.compile(r"^# ={8,} (.+?)\s*$")
TRANSLATING_SECTIONS = frozenset({"requests", "answers and streams"})
# What names a provider API or a format: the enums' members, the wire modules, the pair translators.
NAMING = re.compile(
    r"EndpointApi\.\w+|\b(?:Api|Format)\.(?:CHAT|RESPONSES|MESSAGES)\b|anthropic_wire|openai_wire"
    r"|translate_(?:chat|responses)_anthropic|from capmon\.core import [^\n]*\bwire\b|capmon\.core\.wire\b"
)
# The format and dialect modules, and their registries (hub.FORMATS, dialect.DIALECTS).
FORMAT_OR_DIALECT = re.compile(r"(?:chat|responses|messages)_format|\w+_dialect|hub|dialect")
PROVIDERS_PACKAGE = "capmon.core.providers"
# The providers' own modules, before the core's rooms (flat in capmon/core) and after.
PROVIDERS = re.compile(
    r"(^|/)(core/providers/|core/anthropic_wire\.py$|core/wire\.py$|core/translate_[^/]+\.py$|core/formats\.py$)"
)


@dataclass(frozen=True)
class Shape:
    translation_lines: int
    naming_modules: list[tuple[str, str]]  # a module, and what it names
    function_lines: list[int]
    classes: list[tuple[int, str]]
    duplicates: str


def _code_lines(text: str) -> int:
    """Lines that are neither blank nor only a comment (docstrings count: they are part of the code's size)."""
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def _translation_lines(rel: str, text: str) -> int:
    """The translation code of a module that holds some (see the module's docstring)."""
    if not FORMAT_MODULE.search(rel) or not any(SECTION.match(line) for line in text.splitlines()):
        return _code_lines(text)
    kept: list[str] = []
    section = None
    for line in text.splitlines():
        opened = SECTION.match(line)
        if opened:
            section = opened.group(1)
        elif section in TRANSLATING_SECTIONS:
            kept.append(line)
    return _code_lines("\n".join(kept))


def _imported_modules(tree: ast.AST) -> list[str]:
    """The format and dialect modules (and registries) a module imports, by name."""
    found: list[str] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == PROVIDERS_PACKAGE:
                names = [a.name for a in node.names]
            elif node.module.startswith(PROVIDERS_PACKAGE + "."):
                names = [node.module.split(".")[3]]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[3] for a in node.names if a.name.startswith(PROVIDERS_PACKAGE + ".")]
        found += [n for n in names if FORMAT_OR_DIALECT.fullmatch(n) and n not in found]
    return found


def _names(text: str, tree: ast.AST) -> str:
    """What a module names of the providers ("" when nothing)."""
    named = list(dict.fromkeys(m.group(0) for m in NAMING.finditer(text)))
    imported = [f"imports {m}" for m in _imported_modules(tree)]
    return ", ".join(named + imported)


def measure(root: Path) -> Shape:
    package = root / "capmon"
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    translation = 0
    naming: list[tuple[str, str]] = []
    functions: list[int] = []
    classes: list[tuple[int, str]] = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        if TRANSLATION.search(rel) and "/core/" in rel:
            translation += _translation_lines(rel, text)
        tree = ast.parse(text)
        named = "" if PROVIDERS.search(rel) else _names(text, tree)
        if named:
            naming.append((rel, named))
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
    for name, what in s.naming_modules:
        print(f"  {name}  ({what})")
    print(
        f"functions: {len(sizes)}, lines median {statistics.median(sizes):.0f}, "
        f"p90 {percentile(sizes, 0.9):.0f}, max {sizes[-1]}"
    )
    print("largest classes:")
    print("\n".join("  " + line for line in table([("lines", "class"), *((str(n), c) for n, c in s.classes)])))
    print(f"duplicates in capmon/: {s.duplicates or 'the duplicates command is not on the PATH'}")


if __name__ == "__main__":
    main()
