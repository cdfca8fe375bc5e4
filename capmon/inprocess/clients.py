"""Ready SDK clients whose every request goes through the process's one capmon engine
(capmon/inprocess/home.py) by the gateway's own request handling (transport.py).

Each is the SDK's real client class, made with capmon's httpx client and:

- ``max_retries=0`` unless the caller sets it: capmon already retries, waits and falls
  back; the SDK's retries would stack on top (a 429 after capmon's deadline is final);
- a base URL on a host that never resolves, and a placeholder API key: the provider keys
  come from capmon's config and environment, and the key an SDK sends is ignored.

The openai, anthropic and google-genai packages are imported only when their constructor is called.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

import httpx

from capmon.inprocess.home import RUNTIME, ConfigLike
from capmon.inprocess.transport import ORIGIN, transports

if TYPE_CHECKING:
    import anthropic
    import openai
    from google import genai

PLACEHOLDER_KEY = "capmon-in-process"  # SDKs insist on a key; capmon's come from its config
TIMEOUT = 600.0  # seconds, as the SDKs' default: above the gateway's 540 s deadline, so capmon's answer comes first


def _own(kw: dict[str, Any], name: str) -> None:
    if name in kw:
        raise TypeError(f"{name} is capmon's own here; it sends every request to the process's engine")


def _client(http: ModuleType, sync: bool, config: ConfigLike, kw: dict[str, Any]) -> Any:
    _own(kw, "transport")
    RUNTIME.adopt(config)
    kw.setdefault("base_url", ORIGIN)
    kw.setdefault("timeout", TIMEOUT)
    sync_transport, async_transport = transports(http)
    if sync:
        return http.Client(transport=sync_transport(), trust_env=False, **kw)
    return http.AsyncClient(transport=async_transport(), trust_env=False, **kw)


def httpx_client(config: ConfigLike = None, **kw: Any) -> httpx.Client:
    """An ``httpx.Client`` whose requests all go to the process's engine, for anything that
    takes one (LangChain's ``http_client``); ``kw`` goes to httpx.Client."""
    client: httpx.Client = _client(httpx, True, config, kw)
    return client


def async_httpx_client(config: ConfigLike = None, **kw: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose requests all go to the process's engine (LangChain's
    ``http_async_client``); ``kw`` goes to httpx.AsyncClient."""
    client: httpx.AsyncClient = _client(httpx, False, config, kw)
    return client


def _http_of(sdk: ModuleType) -> ModuleType:
    """The HTTP package an SDK is built on: httpx2 for the anthropic SDK 2.x and newer openai
    SDKs, httpx for older ones (each takes only its own package's client, or converts)."""
    base = importlib.import_module(f"{sdk.__name__}._base_client")
    http = getattr(base, "httpx2", None) or getattr(base, "httpx", None)
    return http if isinstance(http, ModuleType) else httpx


def _sdk(sdk: ModuleType, cls: Any, sync: bool, base_url: str, config: ConfigLike, kw: dict[str, Any]) -> Any:
    _own(kw, "http_client")
    kw.setdefault("max_retries", 0)
    kw.setdefault("api_key", PLACEHOLDER_KEY)
    kw.setdefault("base_url", base_url)
    return cls(http_client=_client(_http_of(sdk), sync, config, {}), **kw)


def openai_client(config: ConfigLike = None, **kw: Any) -> openai.OpenAI:
    """A real ``openai.OpenAI`` through capmon; ``kw`` goes to it (``max_retries`` is 0 unless given)."""
    import openai

    client: openai.OpenAI = _sdk(openai, openai.OpenAI, True, ORIGIN + "/v1", config, kw)
    return client


def async_openai_client(config: ConfigLike = None, **kw: Any) -> openai.AsyncOpenAI:
    """A real ``openai.AsyncOpenAI`` through capmon; ``kw`` goes to it (``max_retries`` is 0 unless given)."""
    import openai

    client: openai.AsyncOpenAI = _sdk(openai, openai.AsyncOpenAI, False, ORIGIN + "/v1", config, kw)
    return client


def anthropic_client(config: ConfigLike = None, **kw: Any) -> anthropic.Anthropic:
    """A real ``anthropic.Anthropic`` through capmon; ``kw`` goes to it (``max_retries`` is 0 unless given)."""
    import anthropic

    client: anthropic.Anthropic = _sdk(anthropic, anthropic.Anthropic, True, ORIGIN, config, kw)
    return client


def async_anthropic_client(config: ConfigLike = None, **kw: Any) -> anthropic.AsyncAnthropic:
    """A real ``anthropic.AsyncAnthropic`` through capmon; ``kw`` goes to it (``max_retries`` is 0 unless given)."""
    import anthropic

    client: anthropic.AsyncAnthropic = _sdk(anthropic, anthropic.AsyncAnthropic, False, ORIGIN, config, kw)
    return client


def genai_client(config: ConfigLike = None, **kw: Any) -> genai.Client:
    """A real ``google.genai.Client`` (Gemini API mode) through capmon, its sync and async
    sides (``.aio``) both; ``kw`` goes to it. Its requests are Google's generateContent,
    served by the gateway's Gemini routes: any model of the config, in Gemini's shapes.
    google-genai retries nothing unless ``http_options.retry_options`` asks."""
    from google import genai
    from google.genai import types

    _own(kw, "vertexai")
    options = kw.pop("http_options", None)
    options = types.HttpOptions.model_validate(options or {}) if not isinstance(options, types.HttpOptions) else options
    for name in ("httpx_client", "httpx_async_client", "aiohttp_client", "base_url"):
        if getattr(options, name) is not None:
            raise TypeError(f"http_options.{name} is capmon's own here; it sends every request to the process's engine")
    kw.setdefault("api_key", PLACEHOLDER_KEY)
    options = options.model_copy(
        update={
            "base_url": ORIGIN,
            "httpx_client": _client(httpx, True, config, {}),
            "httpx_async_client": _client(httpx, False, config, {}),
        }
    )
    return genai.Client(http_options=options, **kw)
