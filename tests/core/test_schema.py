"""The one TOML loader behind config and scenario files, on a schema of its own."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.base.schema import KeyDoc, Loader, document, parse_toml, spec, toml_text

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Step:
    at: float = spec(dataclasses.MISSING, min=0.0, missing="missing; expected seconds since start")
    factor: float | None = spec(None, above=0.0, max=10.0, expected="a finite number")


@dataclass(frozen=True)
class Plan:
    name: str = spec("plan", nonempty=True, printable=True)
    mode: str = spec("fast", choices=("fast", "slow"))
    tags: tuple[str, ...] = spec(("a",), nonempty=True, each={"nonempty": True}, expected="a non-empty list of tags")
    steps: tuple[Step, ...] = spec((), expected="a list of [[{key}]] tables")
    count: int = spec(1, min=1)
    origin: str = field(default="<code>")  # not read from the file


def load(text: str) -> Plan:
    return Loader("p.toml").table(Plan, parse_toml(text, "p.toml"), "")


def test_defaults_and_values() -> None:
    assert load("") == Plan()
    plan = load(
        'name = "n"\nmode = "slow"\ntags = ["x"]\ncount = 3\n[[steps]]\nat = 1\n[[steps]]\nat = 2.5\nfactor = 2'
    )
    assert plan == Plan(name="n", mode="slow", tags=("x",), steps=(Step(at=1.0), Step(at=2.5, factor=2.0)), count=3)
    assert isinstance(plan.steps[0].at, float)


@pytest.mark.parametrize(
    "doc, key, message",
    [
        ("nmae = 1", "nmae", "unknown key; did you mean 'name'?"),
        ("origin = 'x'", "origin", "unknown key; valid keys: name, mode, tags, steps, count"),
        ('name = " "', "name", "expected a non-empty string"),
        ('name = "a\\u0007"', "name", "expected a name without control characters, got 'a\\x07'"),
        ('mode = "medium"', "mode", "expected one of fast, slow, got 'medium'"),
        ("tags = []", "tags", "expected a non-empty list of tags, got [] (list)"),
        ('tags = [""]', "tags[0]", "expected a non-empty string"),
        ("steps = 3", "steps", "expected a list of [[steps]] tables, got 3 (int)"),
        ("[[steps]]\nfactor = 1", "steps[0].at", "missing; expected seconds since start"),
        ("[[steps]]\nat = -1", "steps[0].at", "expected a number >= 0, got -1"),
        ("[[steps]]\nat = 0\nfactor = 0", "steps[0].factor", "expected a number > 0, got 0"),
        ("[[steps]]\nat = 0\nfactor = 11", "steps[0].factor", "expected a number <= 10, got 11"),
        ("[[steps]]\nat = 0\nfactor = 'big'", "steps[0].factor", "expected a finite number, got 'big' (str)"),
        ("[[steps]]\nat = nan", "steps[0].at", "expected a finite number, got nan (float)"),
        ("[[steps]]\nat = 'now'", "steps[0].at", "expected a number, got 'now' (str)"),
        ("count = true", "count", "expected a whole number, got True (bool)"),
        ("count = 0", "count", "expected a whole number >= 1, got 0"),
        ("steps = [1]", "steps[0]", "expected a table, got 1 (int)"),
    ],
)
def test_errors_name_the_file_the_key_and_what_was_expected(doc: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(doc)
    assert (info.value.file, info.value.key, info.value.detail) == ("p.toml", key, message)
    assert str(info.value) == f"p.toml: {key}: {message}"


def test_bad_toml_names_the_file() -> None:
    with pytest.raises(ConfigError, match=r"^p.toml: not valid TOML"):
        load("name = ")


def test_document_lists_every_table_and_key_as_the_loader_reads_them() -> None:
    root, steps = document(Plan)
    assert (root.path, root.array, steps.path, steps.array) == ("", False, "steps", True)
    keys = {k.name: k for k in root.keys}
    assert list(keys) == ["name", "mode", "tags", "steps", "count"]  # origin is not read from the file
    assert keys["name"] == KeyDoc("name", "a string", '"plan"', "not empty; no control characters", "")
    assert keys["mode"].allowed == "one of: fast, slow"
    assert (keys["tags"].kind, keys["tags"].default, keys["tags"].allowed) == (
        "a list of strings",
        '["a"]',
        "not empty; each item: not empty",
    )
    assert (keys["steps"].kind, keys["steps"].default) == ("a list of tables", "[]")
    assert keys["count"].allowed == "at least 1"
    at, factor = steps.keys
    assert (at.default, at.allowed) == (None, "at least 0")  # None: it must be given
    assert (factor.default, factor.allowed) == ("(not set)", "above 0; at most 10")


def test_toml_text_writes_defaults_as_toml_does() -> None:
    assert [toml_text(v) for v in (60.0, 3, False, 'a "b"', (), {}, {"x y": "1"})] == [
        "60.0",
        "3",
        "false",
        '"a \\"b\\""',
        "[]",
        "{}",
        '{"x y" = "1"}',
    ]
