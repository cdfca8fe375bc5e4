"""Bad input at every boundary, as properties: config and scenario files with any TOML
in any key, responses no provider should send, and request bodies no client should send.

Each property states what the boundary promises: a ConfigError naming the file and the
key (never another exception), a Failure with a short, key-free reason (never an
exception), a 4xx answer (never a 500).
"""

from __future__ import annotations

import asyncio
import collections.abc
import dataclasses
import datetime as dt
import enum
import functools
import json
import math
import re
import tomllib
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from capmon.core.base.exceptions import ConfigError
from capmon.core.base.hints import MAX_HINT
from capmon.core.providers.classify import classify, classify_exception, classify_response
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import Config, load_config, parse_config, resolve_keys
from capmon.core.types.failure import Failure, Kind
from capmon.sim import dialects
from capmon.sim.app import create_app, simulator_of
from capmon.sim.model import Simulator
from capmon.sim.scenario import load_scenario, parse_scenario
from tests.reliability.helpers import toml_document, toml_string

FILE = "fuzz.toml"
KEY = "sk-SECRET-canary-1234567890"
NOW = 1_767_225_600.0

# ---------------------------------------------------------------- TOML values

_OFFSETS = st.integers(-23 * 60, 23 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
toml_scalars = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, -1, 2, 64, 1024, 65536, 128_000, 2**31, -(2**63)]),
    st.floats(),  # nan, inf, -0.0, subnormals
    st.booleans(),
    st.dates(),
    st.times(),
    st.datetimes(timezones=st.none() | _OFFSETS),
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)

# Strings a config is made of, so that documents are often nearly right and the
# loader's later checks (names, URLs, references) are reached too.
_PLAUSIBLE_STRINGS = st.sampled_from(
    [
        "",
        "ep",
        "sim",
        "other",
        "flagship",
        "http://127.0.0.1:8089/v1",
        "https://api.example.com/v1",
        "ftp://x",
        "REL_KEY",
        "OTHER_KEY",
        "1BAD",
        "has space",
        "127.0.0.1:8089",
        "[::1]:8089",
        "localhost:0",
        "nowhere",
        "demo",
        "steady",
        "/nonexistent.toml",
        "é",
        "\x00",
    ]
)


@functools.cache  # build each strategy once: building them in draws is slow
def _plausible(tp: Any) -> st.SearchStrategy[Any]:
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(-2, 200_000) | st.sampled_from([0, 1, 2**62])
    if tp is float:
        return st.floats(-1, 5000) | st.sampled_from([0.0, 0.001, math.nan, math.inf, -math.inf])
    if tp is str:
        return _PLAUSIBLE_STRINGS | st.text(max_size=10)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):  # a StrEnum key: its values, or a near miss
        return st.sampled_from([m.value for m in tp]) | _PLAUSIBLE_STRINGS
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # an optional key (a deployment's own limits): its type's values
        return st.one_of(*(_plausible(a) for a in typing.get_args(tp) if a is not type(None)))
    if origin is tuple:
        (inner,) = typing.get_args(tp)[:1]
        return st.lists(_value_for(inner), max_size=3)
    if origin in (collections.abc.Mapping, dict):
        return st.dictionaries(st.text(max_size=8), st.text(max_size=8) | toml_scalars, max_size=3)
    if dataclasses.is_dataclass(tp):
        return _table(tp)
    raise AssertionError(tp)


@functools.cache
def _value_for(tp: Any) -> st.SearchStrategy[Any]:
    # Mostly a value of about the right type; sometimes anything at all.
    return st.one_of(_plausible(tp), _plausible(tp), _plausible(tp), toml_values)


def _near_miss(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name + "s", name[:-1], name.upper(), name.replace("_", "-"), "_" + name])


@functools.cache
def _table(cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.name != "path"]
    values = {name: _value_for(hints[name]) for name in fields}
    unknowns = st.sampled_from(fields).flatmap(_near_miss) | st.text(min_size=1, max_size=10)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in fields:
            if draw(st.integers(0, 9)) < 7:  # most keys present
                out[name] = draw(values[name])
        if draw(st.integers(0, 9)) == 0:  # an unknown key: a typo or anything
            unknown = draw(unknowns)
            if unknown not in fields:
                out[unknown] = draw(toml_values)
        return out

    return build()


config_documents = st.one_of(_table(Config), st.dictionaries(st.text(max_size=10), toml_values, max_size=4))


def _key_root(key: str) -> str:
    if key.startswith('"'):  # a quoted key: read it back as TOML does
        end = 1
        while key[end] != '"':
            end += 2 if key[end] == "\\" else 1
        return tomllib.loads(key[: end + 1] + " = 0").popitem()[0]
    return re.split(r"[.\[]", key, maxsplit=1)[0]


def _check_config_error(e: ConfigError, doc: dict[str, Any], valid_roots: set[str]) -> None:
    message = str(e)
    assert message.startswith(f"{FILE}: "), message
    assert e.key, f"no key named: {message}"
    assert message.startswith(f"{FILE}: {e.key}: "), message
    assert _key_root(e.key) in set(doc) | valid_roots, (e.key, list(doc))
    assert e.detail and "\n" not in e.detail  # one line on stderr
    assert "Traceback" not in message


# ---------------------------------------------------------------- config files


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=config_documents)
def test_any_config_document_loads_or_gives_a_config_error_naming_file_and_key(doc: dict[str, Any]) -> None:
    text = toml_document(doc)
    tomllib.loads(text)  # the generator writes valid TOML; the loader's job is the rest
    try:
        cfg = parse_config(text, FILE)
    except ConfigError as e:
        _check_config_error(e, doc, {f.name for f in dataclasses.fields(Config)})
        event(f"ConfigError at {_key_root(e.key)}")
        return
    event("loaded")
    # A config that loads is usable: keys resolve and a client can be built from it.
    env = {k.env: "sk-fuzz-0123456789abcdef" for e in cfg.endpoints for k in e.keys}
    keys = resolve_keys(cfg, env)
    client = FallbackClient(cfg, keys=keys, transport=httpx.MockTransport(lambda request: httpx.Response(500)))
    assert client.targets
    asyncio.run(client.aclose())


_RICH = """
[simulator]
enabled = false
listen = "127.0.0.1:8089"
scenario = "demo"

[[endpoints]]
name = "ep"
base_url = "http://127.0.0.1:1/v1"
keys = [{ env = "REL_KEY", alias = "a" }, { env = "OTHER_KEY" }]
headers = { x-org = "o" }

[[endpoints]]
name = "other"
base_url = "https://api.example.com/v1"
simulated = true
keys = [{ env = "OTHER_KEY" }]

[[models]]
name = "big"
api_model = "sim-flagship"
endpoints = ["ep", "other"]
context_window = 128000
max_tokens = 512
rpm = 60
tpm = 100000
max_concurrency = 4

[[models]]
name = "small"
endpoints = ["other"]

[client]
attempt_timeout = 60.0
connect_timeout = 10.0
deadline = 900.0
max_attempts = 50
retry_budget = 0.2
max_connections = 256

[backoff]
base = 0.5
cap = 30.0
transient_cap = 5.0
hint_spread = 0.5
max_hint = 3600.0

[breaker]
failure_threshold = 3
failure_ratio = 0.5
ratio_window = 60.0
ratio_min_requests = 20
cooldown = 300.0
cooldown_multiplier = 2.0
cooldown_max = 1800.0
half_open_probes = 1
ramp_start = 0.1
ramp_duration = 60.0

[limiter]
initial = 8
min = 1
max = 64
decrease = 0.5

[dashboard]
refresh = 0.33
probe_interval = 5.0
demo_items = 2000
"""


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _like(value: Any) -> st.SearchStrategy[Any]:
    """A value of the same TOML type as ``value`` (so the document often stays valid)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(-3, 300_000) | st.sampled_from([0, 1, 2**63 - 1, -(2**63)])
    if isinstance(value, float):
        return st.floats(-1, 5000) | st.sampled_from([0.0, 1e-9, 1e308, math.nan, math.inf, -math.inf])
    if isinstance(value, str):
        return _PLAUSIBLE_STRINGS | st.text(max_size=10)
    return toml_values


@st.composite
def mutated(draw: st.DrawFn, base: str) -> dict[str, Any]:
    """A working document with up to three random edits: a key set to a value of its
    own type or of any type, a key deleted, or an unknown key added."""
    doc = tomllib.loads(base)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(list(_paths(doc))))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        op = draw(st.sampled_from(["like", "like", "any", "delete", "unknown"]))
        if op == "delete":
            del parent[last]
        elif op == "unknown" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = draw(toml_values)
        elif op == "like":
            parent[last] = draw(_like(parent[last]))
        else:
            parent[last] = draw(toml_values)
    return doc


@settings(max_examples=200, deadline=None)
@given(doc=mutated(_RICH))
def test_a_working_config_with_random_edits_loads_or_names_the_edited_key(doc: dict[str, Any]) -> None:
    text = toml_document(doc)
    assert tomllib.loads(text) is not None
    try:
        cfg = parse_config(text, FILE)
    except ConfigError as e:
        _check_config_error(e, doc, {f.name for f in dataclasses.fields(Config)})
        event(f"ConfigError at {_key_root(e.key)}")
        return
    event("loaded")
    keys = resolve_keys(cfg, {k.env: "sk-fuzz-0123456789abcdef" for e in cfg.endpoints for k in e.keys})
    client = FallbackClient(cfg, keys=keys, transport=httpx.MockTransport(lambda request: httpx.Response(500)))
    assert client.targets and client.snapshot().targets
    asyncio.run(client.aclose())


def test_the_working_base_config_loads() -> None:
    assert [m.name for m in parse_config(_RICH, FILE).models] == ["big", "small"]


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        pytest.param(b"\xff\xfe[models]\n", "cannot read", id="not-utf8"),
        pytest.param(b"models = [\n", "not valid TOML", id="bad-toml"),
        pytest.param(b"", "expected at least one [[models]] table", id="empty"),
        pytest.param(b"\x00", "not valid TOML", id="nul"),
    ],
)
def test_unreadable_config_files_give_a_config_error(tmp_path: Path, content: bytes, detail: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ") and detail in str(info.value)


def test_a_directory_or_a_missing_file_as_config(tmp_path: Path) -> None:
    for path, detail in ((tmp_path, "cannot read"), (tmp_path / "nope.toml", "no such file")):
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value) == f"{path}: {detail}" or str(info.value).startswith(f"{path}: {detail}")


# ---------------------------------------------------------------- scenario files

_SCENARIO_SCHEMA: dict[str, Any] = {
    "name": str,
    "description": str,
    "seed": int,
    "repeat": float,
    "keys": (str,),
    "penalty": {"enabled": bool, "threshold": int, "window": float, "duration": float},
    "models": (
        {
            "name": str,
            "slots": int,
            "base_latency": float,
            "per_token": float,
            "noise": float,
            "answer_tokens": int,
            "context_window": int,
            "dialect": str,
            "hint": float,
            "schedule": ({"at": float, "slots": int, "latency_factor": float, "dialect": str, "hint": float},),
        },
    ),
}
_SCENARIO_STRINGS = st.sampled_from(["", "sim-a", "sim-b", *dialects.DIALECTS, "openai-500", "*", "sk-capmon-sim-demo"])


def _scenario_value(schema: Any) -> st.SearchStrategy[Any]:
    if isinstance(schema, dict):
        return _scenario_table(schema)
    if isinstance(schema, tuple):
        return st.lists(_scenario_value(schema[0]), min_size=0, max_size=3)
    if schema is str:
        plausible: st.SearchStrategy[Any] = _SCENARIO_STRINGS | st.text(max_size=8)
    elif schema is int:
        plausible = st.integers(-2, 1000) | st.sampled_from([2**62, 10**6])
    elif schema is float:
        plausible = st.floats(-1, 1000) | st.sampled_from([0.0, 1e-300, 1e300, math.inf, math.nan])
    else:
        plausible = st.booleans()
    return st.one_of(plausible, plausible, plausible, toml_values)


def _scenario_table(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    values = {k: _scenario_value(v) for k, v in schema.items()}

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out = {k: draw(v) for k, v in values.items() if draw(st.integers(0, 9)) < 7}
        if draw(st.integers(0, 12)) == 0:
            unknown = draw(st.text(min_size=1, max_size=8))
            if unknown not in schema:
                out[unknown] = draw(toml_values)
        return out

    return build()


_RICH_SCENARIO = (
    (Path(__file__).resolve().parents[2] / "capmon" / "sim" / "scenarios" / "demo.toml").read_text()
    + """
[[models]]
name = "sim-extra"
dialect = "azure-429"
hint = 2.5

[[models.schedule]]
at = 1.5
hint = 0.25
dialect = "gemini-429"
latency_factor = 0.5
"""
)
_RICH_SCENARIO = _RICH_SCENARIO.replace(
    "\nrepeat = 120\n",
    """\nrepeat = 120
keys = ["sk-capmon-sim-demo", "*"]

[penalty]
enabled = true
threshold = 5
window = 10.0
duration = 30.0
""",
)
scenario_documents = st.one_of(
    mutated(_RICH_SCENARIO),
    _scenario_table(_SCENARIO_SCHEMA),
    st.dictionaries(st.text(max_size=8), toml_values, max_size=3),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=scenario_documents)
def test_any_scenario_document_loads_or_gives_a_config_error_naming_file_and_key(doc: dict[str, Any]) -> None:
    text = toml_document(doc)
    tomllib.loads(text)
    try:
        scn = parse_scenario(text, FILE)
    except ConfigError as e:
        _check_config_error(e, doc, set(_SCENARIO_SCHEMA))
        event(f"ConfigError at {_key_root(e.key)}")
        return
    event("loaded")
    # A scenario that loads can be served: every model, at every phase, in every dialect.
    sim = Simulator(scn, _FrozenClock())
    sim.start(0.0)
    for t in [0.0, *(p.at for m in scn.models for p in m.schedule)]:
        sim.clock.t = t  # type: ignore[attr-defined]
        for m in scn.models:
            state = sim.state(m.name)
            for dialect in dialects.DIALECTS:
                wire = dialects.capacity_rejection(dialect, model=m.name, slots=state.slots, hint=state.hint)
                assert 400 <= wire.status < 600
                wire.json() if wire.media_type == "application/json" else None
            decision = sim.submit(
                sim._accepted and next(iter(sim._accepted.values())) or "key-x",
                m.name,
                prompt_tokens=1,
                max_tokens=None,
            )
            ticket = getattr(decision, "ticket", None)
            if ticket is not None:
                assert ticket.service_time >= 0 and math.isfinite(ticket.service_time), ticket
                sim.release(ticket)


class _FrozenClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return NOW + self.t

    async def sleep(self, seconds: float) -> None:  # pragma: no cover - not used
        self.t += seconds


def test_a_missing_scenario_file_and_a_bundled_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_scenario("/nonexistent.toml")
    assert str(info.value).startswith("/nonexistent.toml: no bundled scenario or file by that name")
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"^" + re.escape(str(bad)) + ": cannot read"):
        load_scenario(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_scenario(tmp_path)  # a directory


# ---------------------------------------------------------------- responses


def _check_failure(failure: Failure | None, *, must_fail: bool = True) -> Failure:
    if not must_fail and failure is None:
        return failure  # type: ignore[return-value]
    assert isinstance(failure, Failure), failure
    assert isinstance(failure.kind, Kind)
    assert failure.reason and len(failure.reason) <= 400, len(failure.reason)
    failure.reason.encode("utf-8")  # printable on any terminal that takes UTF-8
    assert KEY not in failure.reason and "SECRET-can" not in failure.reason
    if failure.retry_after is not None:
        assert math.isfinite(failure.retry_after) and 0.0 <= failure.retry_after <= MAX_HINT
    return failure


def _nested(depth: int, leaf: Any = "overloaded") -> Any:
    value: Any = leaf
    for i in range(depth):
        value = {"error": value} if i % 2 else [value]
    return value


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"retry-after": "9" * 100_000}, id="huge-value"),
        pytest.param({f"x-h-{i}": "v" * 100 for i in range(2000)}, id="many-headers"),
        pytest.param({"retry-after": "١٢"}, id="arabic-indic-digits"),  # str.isdigit() says yes; float() says yes
        pytest.param({"retry-after": "２"}, id="fullwidth-digit"),
        pytest.param({"retry-after-ms": "1e400"}, id="ms-overflow"),
        pytest.param({"x-ratelimit-reset-requests": "1" * 400 + "h"}, id="duration-overflow"),
        pytest.param({"Retry-After": "Thu, 01 Jan 2026 00:00:30 GMT\r\nX: y"}, id="crlf"),
        pytest.param({"retry-after": "\x00\x01"}, id="control"),
        pytest.param({"retry-after": "3", "RETRY-AFTER": "4"}, id="two-spellings"),
    ],
)
def test_strange_headers_are_survived(headers: dict[str, str]) -> None:
    for status in (429, 503, 200):
        _check_failure(classify_response(status, headers, b'{"error": {"message": "slow down"}}', now=NOW))
    encoded = httpx.Headers(
        [(k.encode("latin-1", "replace"), v.encode("latin-1", "replace")) for k, v in headers.items()]
    )
    _check_failure(classify_response(429, encoded, b"", now=NOW))


def test_non_ascii_header_bytes_through_httpx() -> None:
    # Headers as they come off the wire: latin-1 bytes that are not valid UTF-8, and UTF-8 ones.
    raw = [
        (b"retry-after", b"\xff\xfe2"),
        (b"x-ratelimit-reset-requests", "５s".encode()),
        (b"retry-after-ms", b"\xe2\x80\x8b"),
    ]
    response = httpx.Response(
        429,
        headers=raw,
        content=b'{"error": {"message": "Rate limit reached"}}',
        request=httpx.Request("POST", "http://x"),
    )
    failure = _check_failure(classify(response, now=NOW))
    assert failure.kind is Kind.RATE_LIMITED


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\xff\xfe\xfd" * 1000, id="not-utf8"),
        pytest.param(b'{"error": {"message": "at capacity \xff\xfe"}}', id="json-with-bad-bytes"),
        pytest.param('{"error": {"message": "überlastet – 过载 \U0001f525"}}'.encode("utf-16"), id="utf16"),
        pytest.param(b"\x00" * 10_000, id="nuls"),
        pytest.param(json.dumps(_nested(50)).encode(), id="nested-50"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-100k"),
        pytest.param(b'{"error":' * 50_000 + b"1" + b"}" * 50_000, id="nested-objects-50k"),
        pytest.param(b"<html><title>" + b"<" * 200_000, id="html-of-angles"),
        pytest.param(b"<html>" + b"<script>" * 50_000, id="unclosed-scripts"),
        pytest.param(b"x" * 5_000_000, id="5MB-text"),
        pytest.param(b'{"error": {"message": "' + b"a" * 2_000_000 + b'"}}', id="2MB-message"),
        pytest.param(
            b'{"error": {"message": "ok", "details": ' + json.dumps([{"reason": "x"}] * 100_000).encode() + b"}}",
            id="many-details",
        ),
        pytest.param(b'\xef\xbb\xbf{"error": {"message": "overloaded"}}', id="bom"),
        pytest.param(b'{"error": {"message": NaN, "code": Infinity}}', id="nan-in-json"),
        pytest.param(b'{"error": {"message": 1e999999}}', id="float-overflow"),
        pytest.param(b'{"error": {"message": ' + b"9" * 5000 + b"}}", id="huge-int"),  # int parsing limit (3.11)
        pytest.param(b'{"error": {"message": "\\ud800 lone surrogate"}}', id="lone-surrogate-escape"),
    ],
)
@pytest.mark.parametrize("status", [200, 503])
def test_strange_bodies_are_classified(body: bytes, status: int) -> None:
    failure = _check_failure(classify_response(status, {"content-type": "application/json"}, body, now=NOW))
    if status == 200:
        assert failure.kind is Kind.TRANSIENT or failure.status == 200


@settings(max_examples=300, deadline=None)
@given(
    before=st.text(st.characters(codec="utf-8"), max_size=500),
    after=st.text(max_size=50),
    shape=st.sampled_from(["openai", "plain", "html-title", "html-body", "error-string", "code", "exception"]),
    status=st.sampled_from([200, 400, 401, 403, 429, 500, 503]),
)
def test_an_echoed_key_never_reaches_a_reason(before: str, after: str, shape: str, status: int) -> None:
    text = before + KEY + after
    if shape == "exception":
        _check_failure(classify_exception(httpx.ConnectError(text)))
        return
    body = {
        "openai": lambda: json.dumps(
            {"error": {"message": text, "type": "invalid_request_error", "code": "invalid_api_key"}}
        ),
        "plain": lambda: text,
        "html-title": lambda: f"<html><head><title>{text}</title></head><body>x</body></html>",
        "html-body": lambda: f"<html><body><h1>{text}</h1></body></html>",
        "error-string": lambda: json.dumps({"error": text}),
        "code": lambda: json.dumps({"error": {"message": "no", "code": text}}),
    }[shape]()
    _check_failure(classify_response(status, {}, body.encode("utf-8", "surrogatepass"), now=NOW))


def test_a_large_answer_is_an_answer() -> None:
    # More than the 64 KiB the classifier scans for patterns: still JSON, still a success.
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "word " * 50_000}}]}
    assert classify_response(200, {}, json.dumps(answer).encode(), now=NOW) is None


@pytest.mark.parametrize("body", [b'{"choices": []}', b'{"choices": null}', b'{"choices": {}}', b'{"id": "x"}'])
def test_a_200_without_choices_is_a_broken_body(body: bytes) -> None:
    failure = _check_failure(classify_response(200, {}, body, now=NOW))
    assert failure.kind is Kind.TRANSIENT and failure.reason.startswith("200 with a broken body")


@settings(max_examples=200, deadline=None)
@given(status=st.integers(-10, 1000) | st.sampled_from([0, 599, 600, 999]), body=st.binary(max_size=64))
def test_any_status_number_is_classified(status: int, body: bytes) -> None:
    failure = classify_response(status, {}, body, now=NOW)
    if 200 <= status < 300 and failure is None:
        return
    _check_failure(failure)


# ---------------------------------------------------------------- the simulator's request parsing

_SIM_KEY = "sk-capmon-sim-demo"


@pytest.fixture(scope="module")
def sim_loop() -> Iterator[tuple[asyncio.AbstractEventLoop, httpx.AsyncClient, Any]]:
    from capmon.sim.scenario import ModelSpec, Scenario

    scn = Scenario(
        name="fuzz",
        models=(
            ModelSpec(
                name="sim-small",
                slots=1000,
                base_latency=0.0,
                per_token=0.0,
                noise=0.0,
                answer_tokens=3,
                context_window=1000,
            ),
        ),
    )
    app = create_app(scn)
    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim")
    try:
        yield loop, client, app
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


_CHAT_FIELDS = st.sampled_from(
    [
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "stream_options",
        "n",
        "temperature",
        "tools",
    ]
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system"])}, optional={"content": json_values | st.text(max_size=40)}
    )
    | json_values,
    max_size=3,
)
chat_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"model": st.sampled_from(["sim-small", "sim-nope", ""]) | json_values, "messages": _MESSAGES},
        optional={
            "max_tokens": st.integers(-5, 10**30) | json_values,
            "max_completion_tokens": st.integers(-5, 5000) | json_values,
            "stream": st.booleans() | json_values,
            "stream_options": st.fixed_dictionaries({"include_usage": json_values}) | json_values,
        },
    ),
    st.dictionaries(_CHAT_FIELDS, json_values, max_size=5),
)


def _post(sim_loop: Any, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    loop, client, app = sim_loop
    hdrs = {"Authorization": f"Bearer {_SIM_KEY}", "content-type": "application/json", **(headers or {})}
    response = loop.run_until_complete(client.post("/v1/chat/completions", content=content, headers=hdrs))
    assert simulator_of(app).stats()["totals"]["in_flight"] == 0  # no slot leaked
    return response


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=chat_bodies)
def test_no_json_body_makes_the_simulator_answer_500(sim_loop: Any, body: Any) -> None:
    response = _post(sim_loop, json.dumps(body).encode())
    assert response.status_code in (200, 400, 404), (response.status_code, response.text[:200])
    if response.status_code != 200:
        assert response.json()["error"]["message"]
    elif body.get("stream") is True:
        assert response.text.rstrip().endswith("data: [DONE]")
    else:
        assert response.json()["choices"][0]["message"]["content"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    content=st.binary(max_size=200)
    | st.sampled_from(
        [b"[" * 5000, b'{"a":' * 5000, b"\xff", b"", b"null", b'{"model": "sim-small", "messages": [{}]} trailing']
    )
)
def test_no_bytes_make_the_simulator_answer_500(sim_loop: Any, content: bytes) -> None:
    response = _post(sim_loop, content)
    assert response.status_code in (200, 400, 404), (response.status_code, response.text[:200])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    token=st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=40),
    scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", "", "Bearer  "]),
)
def test_no_authorization_header_makes_the_simulator_answer_500(sim_loop: Any, token: str, scheme: str) -> None:
    body = json.dumps({"model": "sim-small", "messages": [{"role": "user", "content": "hi"}]}).encode()
    loop, client, _ = sim_loop
    headers = {"Authorization": (scheme + token).encode("latin-1")}  # as bytes: any octet goes on the wire
    response = loop.run_until_complete(client.post("/v1/chat/completions", content=body, headers=headers))
    assert response.status_code in (200, 401), response.status_code
    if response.status_code == 401:
        # the simulator never echoes a whole key back
        # (a short or wordy token may match the message's own words by chance)
        secretish = len(token.strip()) >= 16 and not token.strip().replace(" ", "").isalpha()
        assert not secretish or token.strip() not in response.text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(["/admin/faults", "/admin/models/sim-small", "/admin/outage/sim-small", "/admin/reset"]),
    body=json_values
    | st.lists(
        st.fixed_dictionaries(
            {"mode": st.sampled_from(["reset", "hang", "off", 3])},
            optional={"count": json_values, "rate": json_values, "model": json_values},
        )
    ),
    raw=st.none() | st.sampled_from([b"[" * 5000, b"\xff", b"{"]),
)
def test_no_admin_body_makes_the_simulator_answer_500(sim_loop: Any, path: str, body: Any, raw: bytes | None) -> None:
    loop, client, app = sim_loop
    content = raw if raw is not None else json.dumps(body).encode()
    response = loop.run_until_complete(client.post(path, content=content))
    assert response.status_code in (200, 400), (response.status_code, response.text[:200])
    # put the simulator back as it was
    simulator_of(app).faults.clear()
    simulator_of(app).configure("sim-small", reset_schedule=True)


@settings(max_examples=200, deadline=None)
@given(
    hint=st.none() | st.floats(min_value=0.0, allow_infinity=False, allow_nan=False),
    slots=st.integers(-5, 10**9),
    # a model id as providers spell them: the rejection's text echoes it, and a name made of
    # the words of another kind ("request_too_large") would be classified as that kind
    model=st.from_regex(r"[a-z0-9][a-z0-9.\-]{0,19}", fullmatch=True),
)
def test_every_dialect_renders_any_hint(hint: float | None, slots: int, model: str) -> None:
    for dialect in dialects.DIALECTS:
        wire = dialects.capacity_rejection(dialect, model=model, slots=slots, hint=hint)
        # Bedrock's ServiceQuotaExceededException comes as a 400
        assert wire.status in (429, 503, 529) or (dialect == dialects.BEDROCK_QUOTA and wire.status == 400)
        for value in wire.headers.values():
            value.encode("latin-1")  # every header can go on the wire
        failure = classify_response(wire.status, dict(wire.headers), wire.body, now=NOW)
        assert failure is not None and failure.kind in (Kind.CAPACITY, Kind.RATE_LIMITED, Kind.QUOTA)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[[models]]\nname = "a"\nbase_latency = 1e308', "models[0].base_latency"),
        ('[[models]]\nname = "a"\nper_token = 1e300', "models[0].per_token"),
        ('[[models]]\nname = "a"\nhint = 1e308', "models[0].hint"),
        (
            '[[models]]\nname = "a"\n[[models.schedule]]\nat = 0\nlatency_factor = 1e300',
            "models[0].schedule[0].latency_factor",
        ),
        ('[[models]]\nname = "a"\n[[models.schedule]]\nat = 0\nhint = 1e308', "models[0].schedule[0].hint"),
        ('"" = 1\n[[models]]\nname = "a"', '""'),
        ('[[models]]\nname = "a"\n"my key" = 1', 'models[0]."my key"'),
    ],
)
def test_scenario_values_that_would_make_times_infinite_are_refused(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_scenario(text, FILE)
    assert info.value.key == key and str(info.value).startswith(f"{FILE}: {key}: ")


def test_admin_values_that_would_make_times_infinite_are_refused(sim_loop: Any) -> None:
    loop, client, app = sim_loop
    for body in ({"hint": 1e308}, {"latency_factor": 1e300}, {"hint": -1}, {"latency_factor": 0}):
        response = loop.run_until_complete(client.post("/admin/models/sim-small", json=body))
        assert response.status_code == 400, (body, response.text)
    assert simulator_of(app).state("sim-small").overrides == ()


@settings(max_examples=100, deadline=None)
@given(name=st.text(min_size=1, max_size=20))
def test_any_scenario_name_that_loads_can_go_in_a_header(name: str) -> None:
    # The simulator tags every answer with its scenario's name; a name that cannot be a
    # header value would make every answer fail (uvicorn's h11 refuses it).
    try:
        scn = parse_scenario(f'name = {toml_string(name)}\n[[models]]\nname = "m"\n', FILE)
    except ConfigError as e:
        assert e.key == "name", str(e)
        return

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(scn)), base_url="http://sim") as c:
            return await c.get("/")

    response = asyncio.run(get())
    assert response.status_code == 200
    ((_, value),) = [(k, v) for k, v in response.headers.raw if k == b"x-capmon-simulator"]
    assert all(b == 0x09 or 0x20 <= b <= 0x7E or b >= 0x80 for b in value), value
