"""config.toml -> frozen, validated dataclasses.

Every error names the file, the key (``models[1].max_tokens``) and what was
expected; an unknown key is refused with the closest valid name (the reading and
checking of each field is capmon/core/base/schema.py, shared with scenarios). Secrets never
live in the file: an endpoint's key names the environment variable that holds it,
and a missing variable is reported when the config is resolved at start.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import ipaddress
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capmon.core.base.exceptions import ConfigError
from capmon.core.base.schema import Loader, key_text, parse_toml, read_text
from capmon.core.base.schema import spec as _f
from capmon.core.base.secrets import Secret
from capmon.core.types.prices import Prices

# The key the bundled simulator accepts. Not a secret: it only opens a loopback
# simulator, and it is used only for endpoints marked ``simulated = true``.
SIMULATOR_DEMO_KEY = "sk-capmon-sim-demo"

# The simulator's default address, and the bounds of the dashboard's refresh interval
# (the [dashboard] key and the --refresh flag).
DEFAULT_LISTEN = "127.0.0.1:8089"
REFRESH_MIN, REFRESH_MAX = 0.05, 10.0


class AnthropicVersion(enum.StrEnum):
    """The ``anthropic-version`` header: which rules the API applies to a request."""

    V2026_10_21 = "2026-10-21"  # the current one; the Python 2.x / TypeScript 1.x SDKs send it
    V2023_06_01 = "2023-06-01"  # older SDKs still send it

    @property
    def refuses_sampling(self) -> bool:
        """2026-10-21 answers 400 to temperature / top_p / top_k, even at their defaults."""
        return self is AnthropicVersion.V2026_10_21

    @property
    def refuses_assistant_documents_and_user_citations(self) -> bool:
        return self is AnthropicVersion.V2026_10_21


DEFAULT_VERSION = AnthropicVersion.V2026_10_21


class EndpointApi(enum.StrEnum):
    """Which provider API an endpoint speaks (``[[endpoints]] api``)."""

    OPENAI = "openai"  # {base_url}/chat/completions and /responses, Authorization: Bearer
    ANTHROPIC = "anthropic"  # {base_url}/v1/messages, x-api-key and anthropic-version
    AZURE = "azure"  # Azure OpenAI's deployment URLs or its v1 API, the api-key header
    GEMINI = "gemini"  # the Gemini API: {base_url}/v1beta/models/{model}:generateContent, x-goog-api-key
    VERTEX = "vertex"  # Vertex AI: a project's and region's publisher models, a Google OAuth bearer token
    BEDROCK = "bedrock"  # AWS Bedrock's runtime in a region: Converse, SigV4 or a Bedrock API key


class DropRule(enum.StrEnum):
    """What to do with fields a target cannot take but whose absence leaves an answer's
    meaning whole: sampling parameters (temperature, top_p, top_k) its API version refuses
    (``[client] refused_sampling``), and Anthropic's caching and thinking hints an OpenAI-wire
    target cannot honour (``[client] unhonoured_hints``)."""

    DROP = "drop"  # send without them; the attempt record and x-capmon-dropped say which
    SKIP = "skip"  # do not send the request there: the target is skipped as incapable


class Spread(enum.StrEnum):
    """How a request chooses among one model's deployments (``[[models]] spread``)."""

    ROOM = "room"  # the one with the most room left (learned limit, buckets, less what is in flight)
    ORDER = "order"  # the first that admits, in the config's order: each overflows into the next


# Azure's v1 API ({base_url}/openai/v1/...) takes no api-version; any other value is the
# classic deployment URL's ?api-version=.
AZURE_V1 = "v1"


@dataclass(frozen=True)
class PatienceConfig:
    """How long a server's hint on the model a request prefers may be and still be waited
    out there (a 429 with ``Retry-After: 2``): a shorter hint keeps the request on that
    model, a longer one moves it to another that admits it sooner. Per priority, because
    what a second is worth differs: a person waits for an interactive answer, while a batch
    item has nobody watching and keeps the model it asked for."""

    interactive: float = _f(
        2.0,
        min=0.0,
        doc=(
            "seconds of a server's hint an interactive request waits out on its preferred model rather than"
            " move down (the one- or two-second hints of a burst past a rate limit; 0: move at once)"
        ),
    )
    batch: float = _f(
        30.0,
        min=0.0,
        doc=(
            "seconds of a server's hint a batch request waits out on its preferred model rather than move down"
            " (most per-minute rate limits' hints: the job's items keep the model they asked for)"
        ),
    )

    def of(self, priority: str) -> float:
        """The patience of a request of ``priority`` (result.Priority's values)."""
        return self.batch if priority == "batch" else self.interactive


@dataclass(frozen=True)
class ClientConfig:
    attempt_timeout: float = _f(
        60.0, min=0.001, doc="seconds one attempt may take, a long answer's whole stream included"
    )
    first_token_timeout: float = _f(
        30.0,
        min=0.0,
        doc=(
            "seconds a stream may take to its first output (no headers by then: the route is silent, its"
            " breaker opens); past it the request falls over at once, counted as a capacity failure."
            " 0: off. Plain requests: only a request's own limit applies (its answer comes whole)"
        ),
    )
    stall_timeout: float = _f(
        30.0,
        min=0.0,
        doc="seconds a stream may go without a byte once its output began; past it, it breaks like a cut. 0: off",
    )
    connect_timeout: float = _f(10.0, min=0.001, doc="seconds to open a connection")
    deadline: float = _f(900.0, min=0.001, doc="seconds a request may take, waits included")
    max_attempts: int = _f(50, min=1, doc="attempts per request across all models")
    retry_budget: float = _f(0.2, min=0.0, max=10.0, doc="transient retries allowed per first attempt")
    max_connections: int = _f(256, min=1, doc="connections to the providers held open at most (the transport's pool)")
    batch_share: float = _f(
        0.2, min=0.0, max=1.0, doc="share of freed slots batch requests keep while interactive ones wait"
    )
    max_response_bytes: int = _f(
        8 * 1024 * 1024, min=1024, doc="largest response body (or stream) read; past it the answer fails as oversized"
    )
    transport: str = _f(
        "auto",
        choices=("auto", "httpx", "aiohttp"),
        doc=(
            "the HTTP transport under httpx's API: aiohttp (fast; the aiohttp extra), httpx (httpcore),"
            " or auto: aiohttp when its extra is installed, else httpx"
        ),
    )
    refused_sampling: DropRule = _f(
        DropRule.DROP,
        doc="sampling parameters a target's API version refuses: drop (send without, recorded) or skip the target",
    )
    cap_client_tokens: bool = _f(
        False,
        doc=(
            "a model's max_tokens is a ceiling on the caller's own max_tokens / max_completion_tokens /"
            " max_output_tokens (false: the caller's is sent as given; the model's is the default when it gives none)"
        ),
    )
    continuations: int = _f(
        2,
        min=0,
        doc=(
            "times a stream that breaks after output reached the caller (a cut, an in-stream overload) is"
            " continued by the same model or the next: the partial answer is sent back and only the new"
            " text is forwarded, so the caller gets one whole answer instead of losing it; 0: never (the"
            " break ends the stream with an error); a request opts out with x-capmon-continue: false"
        ),
    )
    unhonoured_hints: DropRule = _f(
        DropRule.DROP,
        doc=(
            "Anthropic hints an OpenAI-wire target cannot honour (cache_control, thinking adaptive or"
            " disabled, the default effort): drop (send without, recorded) or skip the target"
        ),
    )
    patience: PatienceConfig = _f(
        factory=PatienceConfig,
        doc="how long a server's hint on the model a request prefers may be and still be waited out there",
    )


@dataclass(frozen=True)
class BackoffConfig:
    base: float = _f(0.5, min=0.0, doc="full jitter: the n-th retry waits U(0, min(cap, base * 2^n)) seconds")
    cap: float = _f(30.0, min=0.0, doc="the longest a retry waits when the server gave no hint")
    transient_cap: float = _f(5.0, min=0.0, doc="the cap after a transient failure (timeouts, resets, 5xx): shorter")
    hint_spread: float = _f(0.5, min=0.0, max=10.0, doc="a hint h waits U(h, h * (1 + spread))")
    max_hint: float = _f(3600.0, min=0.0, doc="a 429 whose hint is this long or longer is a quota that resets later")


@dataclass(frozen=True)
class BreakerConfig:
    failure_threshold: int = _f(3, min=1, doc="consecutive capacity failures that trip the breaker")
    failure_ratio: float = _f(
        0.5, min=0.0, max=1.0, doc="... or this share of attempts failing for capacity over ratio_window trips it"
    )
    ratio_window: float = _f(60.0, min=1.0, doc="seconds of attempts the failure ratio is taken over")
    ratio_min_requests: int = _f(20, min=1, doc="attempts the window must hold before its ratio can trip the breaker")
    probe_interval: float = _f(2.0, min=0.0, doc="seconds from a trip to the first probe of the open model")
    cooldown: float = _f(60.0, min=0.0, doc="the longest interval between probes while a model stays down")
    cooldown_multiplier: float = _f(2.0, min=1.0, doc="each failed probe multiplies the interval by this")
    cooldown_max: float = _f(1800.0, min=0.0, doc="the longest a server hint may hold off the next probe")
    probe_share: float = _f(
        0.02,
        min=0.0,
        max=1.0,
        doc=(
            "probes earned by each request that wants a down model; a probe is due once a whole one is earned"
            " (at most this share of that work; 0: none by the share)"
        ),
    )
    probe_floor: float = _f(1.0, min=0.0, doc="seconds between two probes of a model at least, whatever the demand")
    probe_interval_wanted: float = _f(
        2.0,
        min=0.0,
        doc=(
            "while a model is down and wanted (probe_wanted_for), seconds between its probes at most, however few"
            " requests come (never closer than probe_floor; 0: the share alone)"
        ),
    )
    probe_wanted_for: float = _f(
        30.0,
        min=0.0,
        doc="seconds a down model stays wanted after the last request that preferred it was served elsewhere or waited",
    )
    half_open_probes: int = _f(1, min=1, doc="probes that must succeed before the ramp starts")
    ramp_start: float = _f(0.5, min=0.0, max=1.0, doc="share of the learned concurrency admitted when the ramp starts")
    ramp_duration: float = _f(60.0, min=0.0, doc="the ramp's ceiling: full traffic after this long however little came")
    ramp_survival: float = _f(
        3.0,
        min=0.0,
        doc=(
            "a ramp's request neither answered nor refused this many times the slowest of the model's recent"
            " refusals after it was sent was admitted: the ramp grows a slot on it, before its answer"
            " (0: by answers only; none until a refusal was timed)"
        ),
    )
    ramp_lead: int = _f(
        4,
        min=1,
        doc=(
            "a survival adds a slot only while fewer of the ramp's requests than this are out unproven"
            " (neither survived nor answered) and fewer of its slots are unused: about the most it sends"
            " past a model that came back with less than before"
        ),
    )


@dataclass(frozen=True)
class LimiterConfig:
    initial: int = _f(8, min=1, doc="a target's concurrency limit before any answer (from min to max)")
    min: int = _f(1, min=1, doc="the lowest the limit goes (at most max)")
    max: int = _f(64, min=1, doc="the highest the limit goes; a model's max_concurrency may lower it")
    decrease: float = _f(
        0.5, min=0.01, max=0.99, doc="multiplicative decrease when rejections come below the learned capacity"
    )


# The alias of the one target of an endpoint with ``keys = []``: it sends no key.
NO_KEY = "no-key"


@dataclass(frozen=True)
class KeyConfig:
    env: str = _f(doc="name of the environment variable that holds the key")
    alias: str = _f("", doc="how the key is shown; defaults to the variable name")


@dataclass(frozen=True)
class EndpointConfig:
    name: str = _f(doc="what models call it in their endpoints (unique)")
    base_url: str = _f(
        "",
        doc=(
            "the provider's http:// or https:// URL; the endpoint's API adds its own paths (api); required but"
            " for api = gemini (https://generativelanguage.googleapis.com), vertex (the region's host) and"
            " bedrock (https://bedrock-runtime.{region}.amazonaws.com)"
        ),
    )
    keys: tuple[KeyConfig, ...] = _f(factory=tuple, doc="the variables holding its keys; [] for a server without keys")
    simulated: bool = _f(False, doc="served by the bundled simulator: a missing key uses its demo key")
    headers: Mapping[str, str] = _f(factory=dict, doc="extra headers every request to it sends (anthropic-beta = ...)")
    api: EndpointApi = _f(
        EndpointApi.OPENAI, doc="the provider API it speaks: openai, anthropic, azure, gemini, vertex or bedrock"
    )
    anthropic_version: AnthropicVersion = _f(
        DEFAULT_VERSION, doc="api = anthropic: the anthropic-version header (2026-10-21 or 2023-06-01)"
    )
    api_version: str = _f(
        "", doc='api = azure: the classic deployment URL\'s api-version; "" or "v1" for the v1 API (/openai/v1)'
    )
    project: str = _f("", doc="api = vertex: the Google Cloud project id (required)")
    region: str = _f(
        "",
        doc=(
            'api = vertex: the location its models run in, "global", a region ("us-east5") or a multi-region'
            ' ("us", "eu") (required: it decides where prompts are processed); api = bedrock: the AWS region'
            ' ("us-east-1") whose runtime it reaches and which its requests are signed for (required)'
        ),
    )
    credentials_file: str = _f(
        "",
        doc=(
            'api = vertex without keys: a service account\'s JSON key file; "": Application Default'
            " Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's login, the metadata server)"
        ),
    )

    @property
    def azure_classic(self) -> bool:
        """Azure's deployment URL (``/openai/deployments/{model}/...?api-version=``)."""
        return self.api is EndpointApi.AZURE and self.api_version not in ("", AZURE_V1)


GEMINI_URL = "https://generativelanguage.googleapis.com"


def default_base_url(api: EndpointApi, region: str) -> str:
    """The URL of an endpoint whose config gives none: the Gemini API's host, Vertex AI's
    host for ``region`` (the global one, a multi-region's, or the region's own), or
    Bedrock's runtime in ``region``; "" for every other API, whose ``base_url`` is required."""
    if api is EndpointApi.GEMINI:
        return GEMINI_URL
    if api is EndpointApi.BEDROCK and region:
        return f"https://bedrock-runtime.{region}.amazonaws.com"
    if api is not EndpointApi.VERTEX or not region:
        return ""
    if region == "global":
        return "https://aiplatform.googleapis.com"
    if region in ("us", "eu"):
        return f"https://aiplatform.{region}.rep.googleapis.com"
    return f"https://{region}-aiplatform.googleapis.com"


# Each provider API's own endpoint keys: the settings of its dialect (the one in
# capmon/core/providers/dialect.py's registry that reads them), set only on an endpoint of
# that API. Declared here, beside the fields, because the config sits below the providers:
# a new dialect's setting is a field above and a line here.
ENDPOINT_SETTINGS: Mapping[EndpointApi, tuple[str, ...]] = {
    EndpointApi.ANTHROPIC: ("anthropic_version",),
    EndpointApi.AZURE: ("api_version",),
    EndpointApi.VERTEX: ("project", "region", "credentials_file"),
    EndpointApi.BEDROCK: ("region",),
}


_TOKEN_PARAMS = ("max_tokens", "max_completion_tokens")


DEFAULT_WINDOW = 128_000  # a model's context window when neither the config nor the catalogue gives one


def deployment_id(model: str, endpoint: str) -> str:
    """The one place a deployment's name is made: a model at one endpoint (every key there),
    what a pin, a trip or a reset may name besides a model or a target."""
    return f"{model}@{endpoint}"


@dataclass(frozen=True)
class CapabilitiesConfig:
    """What a model can do, as the config says (``capabilities = { tools = false }``): each
    left out is learned from the provider or the catalogue's (capmon/core/types/capability.py)."""

    tools: bool | None = _f(None, doc="it calls tools (a request with tools or a forced tool_choice skips it if false)")
    structured_output: bool | None = _f(
        None, doc="it answers in a JSON schema or JSON mode (response_format, text.format, responseMimeType)"
    )
    images: bool | None = _f(None, doc="it reads images in a prompt")
    reasoning: bool | None = _f(
        None, doc="it takes reasoning settings (reasoning_effort, Anthropic's thinking, Gemini's thinkingConfig)"
    )

    def merged(self, over: CapabilitiesConfig) -> CapabilitiesConfig:
        """These, with ``over``'s where it sets them (a deployment's over its model's)."""
        pairs = zip(dataclasses.astuple(self), dataclasses.astuple(over), strict=True)
        return CapabilitiesConfig(*(b if b is not None else a for a, b in pairs))


@dataclass(frozen=True)
class DeploymentConfig:
    """One endpoint's copy of a model (``[[models]] deployments``): the id that endpoint
    knows it by (Bedrock's ``us.anthropic.claude-sonnet-4-5-20250929-v1:0``, Vertex's
    ``claude-sonnet-4-5@20250929``, an Azure deployment's name) and, where they differ
    there, its own limits. A limit left out is the model's."""

    endpoint: str = _f(
        missing="missing; expected the name of an endpoint that serves the model",
        doc="the name of an endpoint that serves the model (an [[endpoints]] name; once per model)",
    )
    model: str = _f("", doc="the id the endpoint knows the model by; defaults to the model's api_model, else its name")
    token_param: str | None = _f(
        None, choices=_TOKEN_PARAMS, doc="how the token cap is sent there; not set: the model's token_param"
    )
    rpm: int | None = _f(None, min=0, doc="requests per minute there, with each key; not set: the model's rpm")
    tpm: int | None = _f(None, min=0, doc="tokens per minute there, with each key; not set: the model's tpm")
    max_concurrency: int | None = _f(
        None, min=0, doc="requests in flight there, with each key; not set: the model's max_concurrency"
    )
    capabilities: CapabilitiesConfig = _f(
        factory=CapabilitiesConfig, doc="what the model can do there; each left out: the model's"
    )
    prices: Prices | None = _f(None, doc="what its tokens cost there, in USD per million; not set: the model's prices")


@dataclass(frozen=True)
class ModelConfig:
    name: str = _f(doc="the name callers use (model= in a request, x-capmon-model in a reply; unique)")
    api_model: str = _f("", doc="the model name sent to the provider; defaults to name")
    endpoints: tuple[str, ...] = _f(
        factory=tuple,
        doc=(
            "the endpoints that serve it under api_model, in the order they are tried (this or deployments:"
            " one deployment per endpoint with the model's id and limits)"
        ),
    )
    deployments: tuple[DeploymentConfig, ...] = _f(
        factory=tuple,
        doc=(
            "the endpoints that serve it, each with the id it knows the model by and its own limits, in the"
            " order they are tried (this or endpoints)"
        ),
    )
    spread: Spread = _f(
        Spread.ROOM,
        doc=(
            "how a request chooses among its deployments and keys: room (the one with the most room left, as a"
            " share of its learned limit and its rpm / tpm buckets, so none runs at its edge while another has"
            " room) or order (the first that admits, each overflowing into the next); never a fallback"
        ),
    )
    context_window: int = _f(
        DEFAULT_WINDOW,
        min=1,
        doc=(
            "the prompt a request may bring, with its output; a request that does not fit skips the model;"
            " not set: the catalogue's for its model (at its first deployment the catalogue knows), else 128000"
        ),
    )
    max_output: int = _f(
        0,
        min=0,
        doc=(
            "the largest output it gives: a request whose own cap is above it skips the model; 0: the"
            " catalogue's (at each deployment), else none known"
        ),
    )
    capabilities: CapabilitiesConfig = _f(
        factory=CapabilitiesConfig,
        doc=(
            "what it can do (tools, structured_output, images, reasoning: true or false); each left out: learned"
            " from the provider, else the catalogue's, else assumed capable"
        ),
    )
    max_tokens: int = _f(
        1024,
        min=1,
        doc=(
            "the output cap sent when the caller gives none (a ceiling on the caller's too with"
            " [client] cap_client_tokens); at most context_window"
        ),
    )
    rpm: int = _f(0, min=0, doc="requests per minute it may send with each endpoint and key (a bucket each); 0: none")
    tpm: int = _f(
        0, min=0, doc="tokens per minute, the same way (a request is charged its prompt and output cap); 0: none"
    )
    max_concurrency: int = _f(
        0, min=0, doc="requests in flight to one target at most: a ceiling on the adaptive limit; 0: the [limiter] max"
    )
    token_param: str = _f(
        "max_tokens",
        choices=_TOKEN_PARAMS,
        doc="how the token cap is sent; reasoning models want max_completion_tokens (learned after one refusal anyway)",
    )
    prefill: bool = _f(
        True,
        doc=(
            "a broken answer is continued with the partial answer as an assistant prefill (on Anthropic's"
            " Messages wire; OpenAI's APIs continue no assistant message, so their models always get an"
            " instruction to continue); false: the instruction here too (models that refuse a prefill;"
            " learned from their 400 anyway)"
        ),
    )
    prices: Prices | None = _f(
        None,
        doc=(
            "what its tokens cost, in USD per million (each answer's cost, the report's, the dashboard's"
            " spend); not set: its answers have no cost"
        ),
    )

    @property
    def wire_name(self) -> str:
        return self.api_model or self.name

    def deployed(self) -> tuple[DeploymentConfig, ...]:
        """Where it is served, in the order tried: its deployments, or the short form's one
        per endpoint with the model's own id and limits."""
        return self.deployments or tuple(DeploymentConfig(endpoint=e) for e in self.endpoints)

    def at(self, d: DeploymentConfig) -> ModelConfig:
        """The model as deployment ``d`` sees it: d's id, limits and prices where it sets them, the
        model's otherwise; its name, window and the rest are the model's (a target carries
        this, so every reader of ``wire_name`` or a limit reads the deployment's)."""
        return dataclasses.replace(
            self,
            api_model=d.model or self.wire_name,
            token_param=self.token_param if d.token_param is None else d.token_param,
            rpm=self.rpm if d.rpm is None else d.rpm,
            tpm=self.tpm if d.tpm is None else d.tpm,
            max_concurrency=self.max_concurrency if d.max_concurrency is None else d.max_concurrency,
            capabilities=self.capabilities.merged(d.capabilities),
            prices=self.prices if d.prices is None else d.prices,
        )


@dataclass(frozen=True)
class SimulatorConfig:
    enabled: bool = _f(True, doc="start the simulated provider in-process (or use one already listening at listen)")
    listen: str = _f(DEFAULT_LISTEN, doc="HOST:PORT the simulator listens on (a fixed port)")
    scenario: str = _f("demo", doc="a bundled scenario name or a path to a scenario TOML")


@dataclass(frozen=True)
class DashboardConfig:
    refresh: float = _f(0.33, min=REFRESH_MIN, max=REFRESH_MAX, doc="seconds between table refreshes")
    probe_interval: float = _f(5.0, min=0.1, doc="seconds between the dashboard's own probes of every target")
    demo_items: int = _f(2000, min=0, doc="items in each round of the demo job, the dashboard's traffic without --job")


@dataclass(frozen=True)
class GatewayKeyConfig:
    env: str = _f(doc="name of the environment variable that holds a client key of the gateway")
    alias: str = _f("", doc="how the key is shown; defaults to the variable name")
    priority: str = _f(
        "interactive",
        choices=("interactive", "batch"),
        doc="the priority of this key's requests; a batch key's requests are always batch",
    )


@dataclass(frozen=True)
class GatewayConfig:
    """``capmon serve`` (capmon/gateway): checked against the models when the gateway starts."""

    listen: str = _f("127.0.0.1:4000", doc="HOST:PORT; beyond loopback only with client keys")
    deadline: float = _f(
        540.0,
        min=0.001,
        doc=(
            "seconds a request without x-capmon-deadline may take, waits included (at most [client] deadline):"
            " below the openai SDKs' 600 s timeout, so a client sees the answer rather than its own timeout"
        ),
    )
    keys: tuple[GatewayKeyConfig, ...] = _f(
        factory=tuple, doc="the client keys; without any the gateway takes any key and listens on loopback only"
    )
    admin_key_env: str = _f("", doc="variable holding the key the control API's actions need; read-only without")
    aliases: Mapping[str, str] = _f(
        factory=dict,
        doc="a model name clients send, or a pattern of them (claude-*), -> a configured model (or auto)",
    )
    max_body_bytes: int = _f(16 * 1024 * 1024, min=1024, doc="largest request body the gateway reads")
    # What a body costs is its objects, not its bytes (600,000 tiny blocks in 16 MiB parse into
    # 150 MB, and every check, the estimate and a translation walk them again): these bound
    # them, far above real traffic (Claude Code sends a few hundred blocks and about 100 tools,
    # a long session a few thousand messages; OpenAI itself takes 128 tools).
    max_messages: int = _f(5_000, min=1, doc="messages (a Responses request's input items) a request may carry")
    max_content_blocks: int = _f(
        10_000,
        min=1,
        doc="content blocks a request may carry in all: content parts, tool calls, tool results' blocks, system blocks",
    )
    max_tools: int = _f(1_000, min=1, doc="tools a request may offer")
    header_timeout: float = _f(
        10.0, min=0.01, max=3600.0, doc="seconds a connection has to send a request's complete headers"
    )
    keep_alive_timeout: float = _f(15.0, min=0.01, max=3600.0, doc="seconds an idle connection stays open")
    write_timeout: float = _f(
        30.0,
        min=0.01,
        max=3600.0,
        doc="seconds a client may leave an answer's bytes unread; past it the answer is cancelled, its slot freed",
    )
    max_connections: int = _f(
        1000, min=1, doc="open client connections at most; past it a new one gets a 503 and is closed"
    )
    cors_origins: tuple[str, ...] = _f(
        factory=tuple, doc="browser origins (scheme://host[:port]) allowed to call the gateway, with CORS"
    )
    access_log: str = _f("", doc="a file (appended to) for one JSON line per request, - for stderr; empty: none")
    workers: int = _f(
        1,
        min=1,
        max=64,
        doc="processes serving one port (SO_REUSEPORT); more than 1 shares their state through [shared] redis",
    )
    http: str = _f(
        "httptools", choices=("httptools", "h11"), doc="the HTTP/1.1 parser: httptools (C, the default) or h11"
    )
    loop: str = _f("asyncio", choices=("asyncio", "uvloop"), doc="the event loop: asyncio, or uvloop when installed")


@dataclass(frozen=True)
class SharedConfig:
    """``[shared]``: several processes acting as one client through Redis (capmon/fleet)."""

    backend: str = _f("memory", choices=("memory", "redis"), doc="memory: this process alone; redis: the namespace's")
    url: str = _f("", doc="redis://host:port/db; without a password (use url_env for one)")
    url_env: str = _f("", doc="environment variable holding the Redis URL, for a URL with a password")
    namespace: str = _f("capmon", doc="prefix of every Redis key: processes on one namespace share their state")
    required: bool = _f(False, doc="true: exit 2 when Redis is unreachable at start; false: warn, run locally")
    lease_ttl: float = _f(5.0, min=0.05, max=3600.0, doc="seconds a killed process's concurrency slots stay taken")
    heartbeat: float = _f(1.0, min=0.01, max=60.0, doc="seconds between heartbeats (registry, lease renewal)")
    reconcile: float = _f(1.0, min=0.01, max=60.0, doc="seconds between full reads: the backstop for missed news")


@dataclass(frozen=True)
class TelemetryConfig:
    """``[telemetry]``: the gateway's traces (OpenTelemetry, the ``otel`` extra: capmon/gateway/traces.py).
    Export headers (a collector's token) come from OTEL_EXPORTER_OTLP_HEADERS, never from this file."""

    otlp_endpoint: str = _f(
        "",
        doc="OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (/v1/traces added when it has no path); empty: no traces",
    )
    service_name: str = _f("capmon-gateway", nonempty=True, printable=True, doc="the spans' service.name")


@dataclass(frozen=True)
class Config:
    models: tuple[ModelConfig, ...] = _f(
        factory=tuple, doc="the models, in preference order: the first that admits a request gets it (at least one)"
    )
    endpoints: tuple[EndpointConfig, ...] = _f(
        factory=tuple,
        doc="where the models are served: each a URL, the provider API it speaks and its keys (at least one)",
    )
    client: ClientConfig = _f(factory=ClientConfig, doc="how each request is sent, and how long it may take")
    backoff: BackoffConfig = _f(factory=BackoffConfig, doc="how long a request waits before it tries again")
    breaker: BreakerConfig = _f(
        factory=BreakerConfig, doc="when a target's breaker trips, how it is probed while down, how traffic ramps back"
    )
    limiter: LimiterConfig = _f(
        factory=LimiterConfig, doc="the adaptive concurrency limit of each target, which learns the provider's capacity"
    )
    simulator: SimulatorConfig = _f(factory=SimulatorConfig, doc="the bundled simulated provider")
    dashboard: DashboardConfig = _f(factory=DashboardConfig, doc="the dashboard (capmon)")
    gateway: GatewayConfig = _f(
        factory=GatewayConfig, doc="capmon serve: the OpenAI- and Anthropic-compatible HTTP gateway"
    )
    shared: SharedConfig = _f(
        factory=SharedConfig, doc="several processes acting as one client through Redis (the fleet)"
    )
    telemetry: TelemetryConfig = _f(
        factory=TelemetryConfig,
        doc="the gateway's traces (OpenTelemetry, the otel extra); none without an otlp_endpoint",
    )
    path: str = field(default="<defaults>", compare=False)

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def endpoint(self, name: str) -> EndpointConfig:
        for e in self.endpoints:
            if e.name == name:
                return e
        raise KeyError(name)


# ---------------------------------------------------------------- loading


def is_loopback(host: str) -> bool:
    """Whether a listen host is this machine only (the simulator's admin and the gateway
    without client keys serve nothing beyond it)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def parse_listen(listen: str, *, fixed: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8089`` for IPv6) -> (host, port). Port 0 asks for any free
    port, unless ``fixed`` (an address clients are pointed at). ValueError otherwise."""
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not (1 if fixed else 0) <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT such as {DEFAULT_LISTEN}, got {listen!r}")
    return host, int(port)


def _names(names: set[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names))


def _new_name(fail: Callable[[str, str], ConfigError], key: str, name: str, seen: set[str], what: str) -> None:
    """A name that identifies its table: non-empty, printable, and not used before."""
    if not name or not name.isprintable():
        raise fail(key, f"expected a non-empty name without control characters, got {name!r}")
    if name in seen:
        raise fail(key, f"duplicate {what} name {name!r}")
    seen.add(name)


_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_API_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


_ENDPOINT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EndpointConfig)}


def _own_settings(fail: Callable[[str, str], ConfigError], where: str, e: EndpointConfig) -> None:
    """A dialect's own key (:data:`ENDPOINT_SETTINGS`) set on an endpoint of another API is
    refused (a key several APIs share, ``region``, on an endpoint of none of them)."""
    owners: dict[str, list[EndpointApi]] = {}
    for api, names in ENDPOINT_SETTINGS.items():
        for name in names:
            owners.setdefault(name, []).append(api)
    for name, apis in owners.items():
        if e.api not in apis and getattr(e, name) != _ENDPOINT_DEFAULTS[name]:
            which = " or ".join(f'"{api}"' for api in apis)
            raise fail(f"{where}.{name}", f'only for api = {which} (this endpoint is api = "{e.api}")')


# A Google Cloud project id (6 to 30 lowercase letters, digits and hyphens; an older
# domain-scoped one has "example.com:" before it) and a Vertex AI location ("us-east5",
# "global", "us"): both go into the URL's path, and the location into its host.
_GCP_PROJECT = re.compile(r"(?:[a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")
_GCP_REGION = re.compile(r"[a-z][a-z0-9-]{0,62}")


def _check_vertex(fail: Callable[[str, str], ConfigError], where: str, e: EndpointConfig) -> None:
    """Vertex AI's own keys: the project and region every URL names."""
    if not e.project:
        raise fail(f"{where}.project", 'missing; expected the Google Cloud project id (api = "vertex")')
    if not _GCP_PROJECT.fullmatch(e.project):
        raise fail(
            f"{where}.project", f'expected a Google Cloud project id such as "my-project-123", got {e.project!r}'
        )
    if not e.region:
        raise fail(
            f"{where}.region",
            'missing; expected the Vertex AI location its models run in, such as "global" or "us-east5"'
            ' (api = "vertex")',
        )
    if not _GCP_REGION.fullmatch(e.region):
        raise fail(f"{where}.region", f'expected a Vertex AI location such as "global" or "us-east5", got {e.region!r}')


# An AWS region: "us-east-1", "eu-central-2", "us-gov-west-1", "ap-southeast-4" (its host's and
# its signature's).
_AWS_REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d{1,2}")


def _check_bedrock(fail: Callable[[str, str], ConfigError], where: str, e: EndpointConfig) -> None:
    """Bedrock's own key: the region every request is signed for (and, by default, sent to)."""
    if not e.region:
        raise fail(
            f"{where}.region",
            'missing; expected the AWS region of its Bedrock runtime, such as "us-east-1" (api = "bedrock": its'
            " requests are signed for it, and its base_url defaults to its runtime's)",
        )
    if not _AWS_REGION.fullmatch(e.region):
        raise fail(f"{where}.region", f'expected an AWS region such as "us-east-1" or "eu-west-3", got {e.region!r}')


def _served(fail: Callable[[str, str], ConfigError], where: str, m: ModelConfig, endpoints: set[str]) -> None:
    """A model names where it is served one way, ``endpoints`` or ``deployments``, each an
    endpoint the config declares, none twice."""
    if m.endpoints and m.deployments:
        raise fail(
            f"{where}.deployments",
            "expected endpoints or deployments, not both (endpoints is the short form: one deployment per endpoint)",
        )
    if not m.endpoints and not m.deployments:
        raise fail(
            f"{where}.endpoints",
            f"expected a list of endpoint names from {_names(endpoints)}, or deployments = [{{ endpoint = ... }}]",
        )
    key = "endpoints[{}]" if m.endpoints else "deployments[{}].endpoint"
    used: set[str] = set()
    for j, d in enumerate(m.deployed()):
        at = f"{where}.{key.format(j)}"
        if d.endpoint not in endpoints:
            close = difflib.get_close_matches(d.endpoint, list(endpoints), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {_names(endpoints)}"
            raise fail(at, f"no endpoint named {d.endpoint!r}{hint}")
        if d.endpoint in used:
            raise fail(at, f"endpoint {d.endpoint!r} is listed twice (one deployment per endpoint)")
        used.add(d.endpoint)
        if d.model and (d.model != d.model.strip() or not d.model.isprintable()):
            raise fail(
                f"{where}.deployments[{j}].model", f"expected a model id without spaces around it, got {d.model!r}"
            )


def _check(cfg: Config, file: str, raw: Mapping[str, Any] | None = None) -> Config:
    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(file, key, message)

    if not cfg.models:
        raise fail("models", "expected at least one [[models]] table")
    if not cfg.endpoints:
        raise fail("endpoints", "expected at least one [[endpoints]] table")
    seen: set[str] = set()
    endpoints: list[EndpointConfig] = []
    for i, e in enumerate(cfg.endpoints):
        _new_name(fail, f"endpoints[{i}].name", e.name, seen, "endpoint")
        _own_settings(fail, f"endpoints[{i}]", e)
        if e.api is EndpointApi.VERTEX:
            _check_vertex(fail, f"endpoints[{i}]", e)
        if e.api is EndpointApi.BEDROCK:
            _check_bedrock(fail, f"endpoints[{i}]", e)
        if not e.base_url:
            url = default_base_url(e.api, e.region)
            if not url:
                raise fail(f"endpoints[{i}].base_url", "missing; expected an http:// or https:// URL")
            e = dataclasses.replace(e, base_url=url)
        endpoints.append(e)
        if not e.base_url.startswith(("http://", "https://")):
            raise fail(f"endpoints[{i}].base_url", f"expected an http:// or https:// URL, got {e.base_url!r}")
        if e.api_version and not _API_VERSION.fullmatch(e.api_version):
            raise fail(
                f"endpoints[{i}].api_version",
                f'expected an Azure api-version such as "2024-10-21", or "v1", got {e.api_version!r}',
            )
        for name, value in e.headers.items():
            where = f"endpoints[{i}].headers.{key_text(name)}"
            if not _HEADER_NAME.fullmatch(name):
                raise fail(where, f"expected an HTTP header name (letters, digits, - and _), got {name!r}")
            if not all(" " <= ch <= "~" or "\x80" <= ch <= "\xff" for ch in value) or value != value.strip():
                raise fail(
                    where,
                    "expected a header value of printable Latin-1 characters without leading or "
                    f"trailing spaces, got {value!r}",
                )
        aliases: set[str] = set()
        for j, k in enumerate(e.keys):
            if not k.env or not k.env.replace("_", "").isalnum():
                raise fail(f"endpoints[{i}].keys[{j}].env", f"expected an environment variable name, got {k.env!r}")
            alias = k.alias or k.env
            if not alias.isprintable():
                raise fail(
                    f"endpoints[{i}].keys[{j}].alias", f"expected a name without control characters, got {alias!r}"
                )
            if alias in aliases:
                raise fail(f"endpoints[{i}].keys[{j}].alias", f"duplicate key alias {alias!r}")
            aliases.add(alias)
    cfg = dataclasses.replace(cfg, endpoints=tuple(endpoints))
    if raw is not None:
        cfg = _windows(cfg, raw)
    names: set[str] = set()
    for i, m in enumerate(cfg.models):
        _new_name(fail, f"models[{i}].name", m.name, names, "model")
        _served(fail, f"models[{i}]", m, seen)
        if m.max_tokens > m.context_window:
            raise fail(
                f"models[{i}].max_tokens", f"expected at most context_window ({m.context_window}), got {m.max_tokens}"
            )
    if cfg.limiter.min > cfg.limiter.max:
        raise fail("limiter.min", f"expected at most limiter.max ({cfg.limiter.max}), got {cfg.limiter.min}")
    if not cfg.limiter.min <= cfg.limiter.initial <= cfg.limiter.max:
        raise fail("limiter.initial", f"expected between limiter.min and limiter.max, got {cfg.limiter.initial}")
    try:
        parse_listen(cfg.simulator.listen, fixed=True)
    except ValueError as e:
        raise fail("simulator.listen", str(e)) from None
    _check_otlp(fail, cfg.telemetry.otlp_endpoint)
    return cfg


def _check_otlp(fail: Callable[[str, str], ConfigError], url: str) -> None:
    if not url:
        return
    try:
        parts = urllib.parse.urlsplit(url)
        # .port raises ValueError for a port that is not a number from 0 to 65535
        good = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:
        good = False
    if "@" in url or "?" in url:  # a collector's token goes in OTEL_EXPORTER_OTLP_HEADERS, and is not echoed
        raise fail(
            "telemetry.otlp_endpoint",
            "expected a URL without credentials or a query (a token: the "
            "OTEL_EXPORTER_OTLP_HEADERS environment variable)",
        )
    if not good:
        raise fail(
            "telemetry.otlp_endpoint", f"expected an http:// or https:// URL such as http://127.0.0.1:4318, got {url!r}"
        )


def _windows(cfg: Config, raw: Mapping[str, Any]) -> Config:
    """Each model whose table sets no context_window gets the catalogue's for it, at its first
    deployment the catalogue knows (capmon/core/types/catalogue.py), else DEFAULT_WINDOW."""
    from capmon.core.types import catalogue  # the catalogue's data is read only when a model needs it

    tables = raw.get("models")
    if not isinstance(tables, list):
        return cfg
    apis = {e.name: e.api for e in cfg.endpoints}
    models = []
    for m, table in zip(cfg.models, tables, strict=False):
        if isinstance(table, Mapping) and "context_window" not in table:
            at = (d for d in m.deployed() if d.endpoint in apis)
            known = (catalogue.entry(apis[d.endpoint], d.model or m.wire_name) for d in at)
            window = next((k.context_window for k in known if k is not None and k.context_window), None)
            if window is not None:
                m = dataclasses.replace(m, context_window=window)
        models.append(m)
    return dataclasses.replace(cfg, models=tuple(models))


def parse_config(text: str, file: str = "<string>") -> Config:
    raw = parse_toml(text, file)
    cfg = Loader(file).table(Config, raw, "")
    cfg = dataclasses.replace(cfg, path=file)
    return _check(cfg, file, raw)


def load_config(path: str | os.PathLike[str]) -> Config:
    return parse_config(read_text(path), str(Path(path)))


def bundled_config_path() -> Path:
    return Path(__file__).resolve().parents[2] / "default_config.toml"  # capmon/default_config.toml


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "capmon" / "config.toml"


def find_config(explicit: str | None = None, environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """``--config``, then ``CAPMON_CONFIG``, then ./config.toml, then the user config
    dir, then the bundled default (the simulator demo)."""
    env = os.environ if environ is None else environ
    if explicit:
        return Path(explicit)
    if env.get("CAPMON_CONFIG"):
        return Path(env["CAPMON_CONFIG"])
    local = (cwd or Path.cwd()) / "config.toml"
    if local.is_file():
        return local
    user = user_config_path()
    if user.is_file():
        return user
    return bundled_config_path()


# ---------------------------------------------------------------- secrets


@dataclass(frozen=True)
class ResolvedKey:
    endpoint: str
    alias: str
    env: str
    secret: Secret = field(repr=False, compare=False)


def resolve_keys(cfg: Config, environ: Mapping[str, str] | None = None) -> dict[tuple[str, str], ResolvedKey]:
    """Read every key from its environment variable, at start, so that a missing
    variable is reported now and not at the first request."""
    env = os.environ if environ is None else environ
    out: dict[tuple[str, str], ResolvedKey] = {}
    missing: dict[str, list[str]] = {}  # each variable not set: the keys that name it
    for i, e in enumerate(cfg.endpoints):
        if not e.keys:  # keys = []: a server that takes none (a local vLLM, Ollama): nothing is sent
            out[(e.name, NO_KEY)] = ResolvedKey(e.name, NO_KEY, "", Secret("", NO_KEY))
        for j, k in enumerate(e.keys):
            alias = k.alias or k.env
            value = env.get(k.env, "")
            if not value:
                if e.simulated:
                    value = SIMULATOR_DEMO_KEY
                else:
                    missing.setdefault(k.env, []).append(f"endpoints[{i}].keys[{j}].env")
                    continue
            out[(e.name, alias)] = ResolvedKey(e.name, alias, k.env, Secret(value, alias))
    if missing:
        # said once per variable, however many endpoints share it (the demo's share one); the
        # error's key is the first, the others are named beside their variable
        keys = [k for where in missing.values() for k in where]
        said = []
        for name, where in missing.items():
            named = [k for k in where if k != keys[0]]
            said.append(f"environment variable {name} is not set" + (f" ({', '.join(named)})" if named else ""))
        raise ConfigError(cfg.path, keys[0], "; ".join(said))
    return out
