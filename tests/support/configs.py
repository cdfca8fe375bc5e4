"""The one config builder for tests: a Config, or its TOML text for a file a command
reads, from the parts a test cares about (models, endpoints, keys, section overrides).

    build_config("http://sim.test/v1")                       # three models on one endpoint
    build_config(url, models=SIMULATED_MODELS, endpoint="sim", simulated=True, client={"deadline": 20.0})
    build_config(url, models=sim_models(["flagship", "medium"]))       # served by sim-flagship, sim-medium
    build_config(url, endpoints={"ep": {"api": "anthropic"}})          # the first endpoint's own keys
    write_config(tmp_path / "config.toml", url, keys=[("CANARY_KEY", "canary")])
    two_providers(openai_url, anthropic_url, first="claude")          # flagship on OpenAI's wire, claude on Anthropic's
    two_deployments(url)                                               # m as sim-m-east at east, sim-m-west at west
    shipped_config(tmp_path, scenario_text)                            # config.toml as shipped, on a free port

Keys come from a fake environment (:data:`ENV`); a test that needs its own passes
``keys`` as (variable, alias) pairs (alias None: none).

A builder of its own beside these is for a suite's own harness (tests/gateway/helpers.py's
``config``, tests/fleet/helpers.py's ``fleet_text``), built on :func:`config_toml`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from capmon.core.types.config import Config, parse_config
from tests.support.scripted import free_port

ROOT = Path(__file__).resolve().parents[2]

ENV = {"TEST_KEY_A": "sk-test-aaaaaaaaaaaaaaaa", "TEST_KEY_B": "sk-test-bbbbbbbbbbbbbbbb"}
SIM_URL = "http://sim.test/v1"
NO_SUCH_HOST = "https://capmon-no-such-host.invalid/v1"  # .invalid never resolves (RFC 2606)

# Three models in preference order, each with its own context window.
THREE_MODELS: Mapping[str, Mapping[str, Any]] = {
    "flagship": {"context_window": 128000},
    "medium": {"context_window": 64000},
    "small": {"context_window": 16000},
}
# The same three names, served by the simulator's models (sim-flagship, ...).
SIMULATED_MODELS: Mapping[str, Mapping[str, Any]] = {
    m: {"api_model": f"sim-{m}"} for m in ("flagship", "medium", "small")
}

Keys = Sequence[tuple[str, str | None]]


def toml_value(value: Any) -> str:
    """A TOML value for the plain values a config holds (strings, numbers, booleans, lists, tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"not a config value: {value!r}")


def _table(header: str, fields: Mapping[str, Any]) -> str:
    return f"\n{header}\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in fields.items() if v is not None)


def _keys(keys: str | Keys | None) -> str:
    if isinstance(keys, str):
        return keys  # already TOML
    assert keys is not None
    return toml_value([{"env": env, **({"alias": alias} if alias else {})} for env, alias in keys])


def config_toml(
    base_url: str = SIM_URL,
    *,
    models: Mapping[str, Mapping[str, Any]] | Iterable[str] = THREE_MODELS,
    endpoint: str = "ep",
    endpoints: Mapping[str, str | Mapping[str, Any]] | None = None,
    keys: str | Keys | None = (("TEST_KEY_A", "a"),),
    simulated: bool = False,
    simulator: Mapping[str, Any] | None = None,
    client: Mapping[str, Any] | None = None,
    backoff: Mapping[str, Any] | None = None,
    breaker: Mapping[str, Any] | None = None,
    limiter: Mapping[str, Any] | None = None,
    dashboard: Mapping[str, Any] | None = None,
    gateway: Mapping[str, Any] | None = None,
    shared: Mapping[str, Any] | None = None,
    extra: str = "",
) -> str:
    """A config's TOML text.

    ``models``: names, or name -> the model's own keys (``endpoints`` defaults to the
    first endpoint, unless it lists its ``deployments``). ``endpoint`` names the endpoint
    at ``base_url``; ``endpoints`` adds more, each a URL or an endpoint's keys (``keys`` and
    ``simulated`` apply to every one that does not set its own; None: no ``keys`` line), or
    gives the first one keys of its own (``api``, ``api_version``...) under its name. The
    sections (``[simulator]`` defaults to ``enabled = false``) take key -> value; ``extra`` is
    TOML appended as it is.
    """
    eps: dict[str, Mapping[str, Any]] = {endpoint: {"base_url": base_url}}
    for name, spec in (endpoints or {}).items():
        eps[name] = {**eps.get(name, {}), **({"base_url": spec} if isinstance(spec, str) else spec)}
    text = _table("[simulator]", {"enabled": False, **(simulator or {})})
    for name, spec in eps.items():
        fields = {
            "name": name,
            "base_url": spec["base_url"],
            "simulated": spec.get("simulated", simulated or None),
            **{k: v for k, v in spec.items() if k not in ("base_url", "simulated", "keys")},
        }
        text += _table("[[endpoints]]", fields)
        if spec.get("keys", keys) is not None:  # None: no keys line at all
            text += f"keys = {_keys(spec.get('keys', keys))}\n"
    specs = models if isinstance(models, Mapping) else {name: {} for name in models}
    for name, spec in specs.items():
        served = {} if "deployments" in spec else {"endpoints": [endpoint]}
        text += _table("[[models]]", {"name": name, **served, **spec})
    for header, fields in (
        ("[client]", client),
        ("[backoff]", backoff),
        ("[breaker]", breaker),
        ("[limiter]", limiter),
        ("[dashboard]", dashboard),
        ("[gateway]", gateway),
        ("[shared]", shared),
    ):
        if fields:
            text += _table(header, fields)
    return text + ("\n" + extra if extra else "")


def sim_models(
    names: Iterable[str], *, on: Mapping[str, str] | None = None, max_tokens: int | None = 64
) -> dict[str, dict[str, Any]]:
    """Models served by the simulator's of the same names (``sim-NAME``), in this order of
    preference, each with a token cap; ``on``: model -> its endpoint, when not the first."""
    return {
        m: {
            "api_model": f"sim-{m}",
            **({"endpoints": [on[m]]} if on and m in on else {}),
            **({"max_tokens": max_tokens} if max_tokens is not None else {}),
        }
        for m in names
    }


def two_providers(
    openai_url: str, anthropic_url: str, *, first: str = "flagship", key_env: str = "PROVIDER_KEY", **parts: Any
) -> str:
    """flagship on OpenAI's wire (endpoint ``oai``) and claude on Anthropic's (``ant``), the
    simulator's sim-flagship and sim-claude behind them, ``first`` preferred; both keys from
    ``key_env`` (aliases oai-key, ant-key)."""
    order = [first, *(m for m in ("flagship", "claude") if m != first)]
    return config_toml(
        openai_url,
        endpoint="oai",
        keys=[(key_env, "oai-key")],
        endpoints={"ant": {"base_url": anthropic_url, "api": "anthropic", "keys": [(key_env, "ant-key")]}},
        models=sim_models(order, on={"claude": "ant"}),
        **parts,
    )


def on_azure(origin: str, *, api_version: str = "", key_env: str = "AZ", **parts: Any) -> Config:
    """gpt on an Azure endpoint (``azure``, alias az) at ``origin``, served by sim-gpt-az;
    ``api_version`` "": the v1 URLs (Azure's default)."""
    return build_config(
        origin,
        endpoint="azure",
        endpoints={"azure": {"api": "azure", **({"api_version": api_version} if api_version else {})}},
        keys=[(key_env, "az")],
        models={"gpt": {"api_model": "sim-gpt-az", "max_tokens": 64}},
        file="azure.toml",
        **parts,
    )


def two_deployments(base_url: str, *, key_env: str = "KEY", spread: str | None = None, **parts: Any) -> Config:
    """One model, ``m``, on two deployments: endpoint ``east`` knows it as sim-m-east, ``west``
    as sim-m-west (both endpoints the simulator at ``base_url``); then ``backup`` (sim-backup)
    at east. One key (alias k) in ``key_env`` for both. ``spread``: m's, when not the default."""
    deployments = [{"endpoint": "east", "model": "sim-m-east"}, {"endpoint": "west", "model": "sim-m-west"}]
    return build_config(
        base_url,
        endpoint="east",
        endpoints={"west": base_url},
        keys=[(key_env, "k")],
        models={
            "m": {"max_tokens": 64, "deployments": deployments, **({"spread": spread} if spread else {})},
            "backup": {"api_model": "sim-backup", "max_tokens": 64},
        },
        file="deployments.toml",
        **parts,
    )


def flagship_and_medium(base_url: str, **parts: Any) -> Config:
    """Two models (flagship, then medium) on the simulator at ``base_url`` (endpoint ``sim``), key in $KEY."""
    return build_config(
        base_url, endpoint="sim", keys=[("KEY", "k")], models=sim_models(["flagship", "medium"]), **parts
    )


def build_config(base_url: str = SIM_URL, *, file: str = "test.toml", **parts: Any) -> Config:
    """A Config from :func:`config_toml`'s parts, as if read from ``file``."""
    return parse_config(config_toml(base_url, **parts), file)


def write_config(path: Path, base_url: str = SIM_URL, **parts: Any) -> Path:
    """:func:`config_toml`'s text written to ``path`` (for a command that reads a file)."""
    path.write_text(config_toml(base_url, **parts))
    return path


def three_models(
    base_url: str,
    *,
    extra: str = "",
    keys: str | Keys = (("TEST_KEY_A", "a"),),
    cooldown: float = 300.0,
    ramp_duration: float = 60.0,
) -> Config:
    """Three models (flagship, medium, small) on one endpoint, a breaker that waits
    ``cooldown`` seconds after a trip and ramps back over ``ramp_duration``."""
    return build_config(
        base_url, keys=keys, breaker={"cooldown": cooldown, "ramp_duration": ramp_duration}, extra=extra
    )


def shipped_config(
    folder: Path,
    scenario: str | None = None,
    *,
    named: str | None = None,
    port: int | None = None,
    replace: Mapping[str, str] | None = None,
    extra: str = "",
    name: str = "config.toml",
) -> tuple[Path, int]:
    """The shipped config.toml, written in ``folder`` (as ``name``): its simulator on ``port``,
    by default a free one (so a capmon already running here cannot interfere), playing
    ``scenario`` (a scenario file's text, written beside it as fast.toml), or the scenario
    ``named`` (a bundled one's name, or a file), or the shipped demo; each text in ``replace``
    (which must be there) replaced, ``extra`` appended. Returns the file and the simulator's port."""
    port = port or free_port()
    text = (ROOT / "config.toml").read_text().replace("127.0.0.1:8089", f"127.0.0.1:{port}")
    if scenario is not None:
        (folder / "fast.toml").write_text(scenario)
        text = text.replace('scenario = "demo"', 'scenario = "fast.toml"')
    elif named is not None:
        text = text.replace('scenario = "demo"', f'scenario = "{named}"')
    for old, new in (replace or {}).items():
        assert old in text, f"the shipped config.toml has no {old!r}"
        text = text.replace(old, new)
    path = folder / name
    path.write_text(text + extra)
    return path, port


# The next model after those of a test of Google's wires: sim-backup on the simulator's OpenAI wire.
BACKUP = """
[[models]]
name = "backup"
api_model = "sim-backup"
endpoints = ["sim"]
max_tokens = 64
"""


def every_api(origin: str, models: str) -> Config:
    """Endpoints on the simulator at ``origin`` for every API: openai (``sim``), anthropic,
    gemini, vertex, bedrock (one key alias k in $KEY: Bedrock's as an API key); ``models``:
    the [[models]] tables."""
    key = 'keys = [{ env = "KEY", alias = "k" }]'
    text = f"""
[[endpoints]]
name = "sim"
base_url = "{origin}/v1"
{key}

[[endpoints]]
name = "anthropic"
api = "anthropic"
base_url = "{origin}"
{key}

[[endpoints]]
name = "gemini"
api = "gemini"
base_url = "{origin}"
{key}

[[endpoints]]
name = "vertex"
api = "vertex"
base_url = "{origin}"
project = "capmon-test"
region = "us-east5"
{key}

[[endpoints]]
name = "bedrock"
api = "bedrock"
base_url = "{origin}"
region = "us-east-1"
{key}

[breaker]
failure_threshold = 3

{models}
"""
    return parse_config(text, "google-wires.toml")


def google_models(origin: str) -> Config:
    """flash on the Gemini API then Vertex AI (sim-flash), claude on Vertex AI (claude-v), and
    backup on the simulator's OpenAI wire (sim-backup)."""
    return every_api(
        origin,
        """
[[models]]
name = "flash"
deployments = [{ endpoint = "gemini", model = "sim-flash" }, { endpoint = "vertex", model = "sim-flash" }]
max_tokens = 64

[[models]]
name = "claude"
deployments = [{ endpoint = "vertex", model = "claude-v" }]  # claude-*: Anthropic's publisher on Vertex
max_tokens = 64
"""
        + BACKUP,
    )
