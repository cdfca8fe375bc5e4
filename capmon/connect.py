"""The gateway's control API from the client's side: what ``capmon --connect URL`` and
``capmon status --connect URL`` read and send (capmon/gateway/control.py is the server).

One place for the address (``http://HOST:PORT``; the ``/v1`` that ``capmon serve``
prints may follow), the keys (environment variables, never the command line: a key in
argv shows in ``ps``), the HTTP client (httpx with ``trust_env=False``, so a proxy set in
the environment never carries a gateway's keys elsewhere) and the errors: each one a
:class:`GatewayError` of one line that names the gateway and never a key.

Reads use the admin key when there is one (the gateway takes it for reads too, and then
tells this caller it may act), else the client key, else none (an open gateway).
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import AsyncGenerator, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from capmon.core.base import text
from capmon.core.base.exceptions import CapmonError
from capmon.core.base.secrets import Secret, redact
from capmon.core.providers.sse import SSEParser
from capmon.core.types import events as ev
from capmon.core.types.serial import event_from_json, snapshot_from_json
from capmon.core.types.snapshot import EngineSnapshot

DEFAULT_KEY_ENV = "CAPMON_GATEWAY_KEY"  # a client key of the gateway: reads
DEFAULT_ADMIN_KEY_ENV = "CAPMON_ADMIN_KEY"  # the gateway's admin key (gateway.admin_key_env there): actions
API_VERSION = 1  # the control API this client speaks (capmon/gateway/control.py API_VERSION)
TIMEOUT = httpx.Timeout(10.0, connect=3.0)
# The gateway writes a comment every 15 s on an idle event stream: a stream silent for
# three of them has lost its gateway (a half-open connection that no reset will end).
STREAM_READ_TIMEOUT = 45.0
_REASON_CHARS = 160


class GatewayError(CapmonError):
    """The gateway cannot be used as asked: not a capmon gateway, a refused key, a refused action."""


class GatewayUnreachable(GatewayError):
    """Nothing answers at the address, or the connection broke: worth retrying."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # what happened, without the address: "no connection (...)"


class KeyRefused(GatewayError):
    """The gateway refused the key that was sent (or wants one and none was)."""


@dataclass(frozen=True)
class ConnectOptions:
    url: str  # http://HOST:PORT of a `capmon serve`
    key_env: str | None = None  # variable holding a client key; None: $CAPMON_GATEWAY_KEY when set
    admin_key_env: str | None = None  # variable holding the admin key; None: $CAPMON_ADMIN_KEY when set
    environ: Mapping[str, str] | None = field(default=None, repr=False)  # None: os.environ


@dataclass(frozen=True)
class GatewayAddress:
    """Where a gateway is and the keys to send it. Its repr shows variable names, never keys."""

    origin: str  # http://host:port, no path
    key: Secret | None = field(default=None, repr=False)
    key_env: str = DEFAULT_KEY_ENV
    admin_key: Secret | None = field(default=None, repr=False)
    admin_key_env: str = DEFAULT_ADMIN_KEY_ENV

    @property
    def shown(self) -> str:
        """The address as the status bar and messages say it: host:port."""
        return self.origin.split("://", 1)[1]

    @property
    def read_key(self) -> Secret | None:
        return self.admin_key or self.key

    def describe_read_key(self) -> str:
        if self.admin_key is not None:
            return f"the admin key in ${self.admin_key_env}"
        if self.key is not None:
            return f"the client key in ${self.key_env}"
        return "no key"


def parse_origin(url: str) -> str:
    """``http://HOST:PORT`` from what a person typed; raises CapmonError naming --connect."""
    raw = url.strip()
    if "://" not in raw:
        raw = "http://" + raw  # 127.0.0.1:4000 means what it says
    try:
        parts = urllib.parse.urlsplit(raw)
        port = parts.port
    except ValueError:
        raise CapmonError(f"--connect: expected http://HOST:PORT, got {text.shorten(url, 80)!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CapmonError(f"--connect: expected http://HOST:PORT, got {text.shorten(url, 80)!r}")
    if parts.username is not None or parts.password is not None:
        # Never echo it: what stands before the @ may be a key.
        raise CapmonError(
            "--connect: the address holds credentials; put the key in an environment variable "
            f"({DEFAULT_KEY_ENV}, or name one with --key-env) and give http://HOST:PORT"
        )
    if parts.path.rstrip("/") not in ("", "/v1") or parts.query or parts.fragment:
        raise CapmonError(
            f"--connect: expected the gateway's address, http://HOST:PORT (the /v1 of its base URL "
            f"may follow), got {text.shorten(url, 80)!r}"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _key(flag: str, named: str | None, default: str, env: Mapping[str, str], alias: str) -> Secret | None:
    name = named if named is not None else default
    if not name or not name.replace("_", "").isalnum():
        raise CapmonError(f"{flag}: expected an environment variable name, got {text.shorten(name, 60)!r}")
    value = env.get(name, "").strip()
    if not value:
        if named is not None:  # asked for by name: its absence is a mistake, not a read-only wish
            raise CapmonError(f"{flag}: environment variable {name} is not set")
        return None
    return Secret(value, alias)


def resolve(options: ConnectOptions) -> GatewayAddress:
    """The address and keys ``options`` name. Raises CapmonError for a bad address or a
    named variable that is not set."""
    env = os.environ if options.environ is None else options.environ
    origin = parse_origin(options.url)
    key_env = options.key_env if options.key_env is not None else DEFAULT_KEY_ENV
    admin_env = options.admin_key_env if options.admin_key_env is not None else DEFAULT_ADMIN_KEY_ENV
    return GatewayAddress(
        origin=origin,
        key=_key("--key-env", options.key_env, DEFAULT_KEY_ENV, env, "gateway client key"),
        key_env=key_env,
        admin_key=_key("--admin-key-env", options.admin_key_env, DEFAULT_ADMIN_KEY_ENV, env, "gateway admin key"),
        admin_key_env=admin_env,
    )


@dataclass(frozen=True)
class GatewayInfo:
    """What GET /capmon/info says the gateway is, for this caller."""

    version: str
    models: tuple[str, ...]
    simulator: str | None  # the bundled simulator's scenario, when the gateway serves it
    readonly: bool  # for this caller: no admin key, or not the gateway's
    admin_key_configured: bool  # the gateway has an admin key at all
    caller: str  # anonymous | client | admin
    events: int  # the number of the gateway's last event when asked

    @classmethod
    def from_json(cls, data: Any, where: str) -> GatewayInfo:
        if not isinstance(data, dict) or data.get("service") != "capmon-gateway":
            raise GatewayError(
                f'{where} answered, but not as a capmon gateway (no "service": "capmon-gateway"); is it `capmon serve`?'
            )
        try:
            models = tuple(str(m) for m in data["models"])
            return cls(
                version=str(data.get("version", "?")),
                models=models,
                simulator=data.get("simulator"),
                readonly=bool(data["readonly"]),
                admin_key_configured=bool(data.get("admin_key_configured")),
                caller=str(data.get("caller", "anonymous")),
                events=int(data.get("events") or 0),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise GatewayError(
                f"{where}: not the control API this capmon speaks (version {API_VERSION}): {type(e).__name__} {e}"
            ) from None


def _message(response: httpx.Response) -> str:
    """The gateway's own words for an error (its OpenAI-shaped body), else the status."""
    try:
        body = response.json()
        message = body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.reason_phrase or f"HTTP {response.status_code}"
    return text.shorten(redact(str(message)), _REASON_CHARS)


def _transport_reason(e: Exception) -> str:
    words = str(e).strip() or type(e).__name__
    if isinstance(e, httpx.ConnectError):
        words = f"no connection ({words})"
    elif isinstance(e, httpx.TimeoutException):
        words = f"no answer in time ({type(e).__name__})"
    return text.shorten(redact(words), _REASON_CHARS)


class GatewayClient:
    """The control API over one httpx client. Use ``async with``, in the loop that uses it."""

    def __init__(self, address: GatewayAddress, *, timeout: httpx.Timeout = TIMEOUT) -> None:
        self.address = address
        self._http = httpx.AsyncClient(
            base_url=address.origin,
            timeout=timeout,
            trust_env=False,
            follow_redirects=False,
            headers={"user-agent": "capmon-connect"},
        )

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self, key: Secret | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key.reveal()}"} if key is not None else {}

    def _where(self, path: str) -> str:
        return f"the gateway at {self.address.origin}" if path == "/capmon/info" else f"{self.address.origin}{path}"

    def _refused(self, response: httpx.Response, key: Secret | None, key_words: str) -> KeyRefused:
        what = _message(response)
        if key is None:
            return KeyRefused(
                f"the gateway at {self.address.origin} needs a key ({response.status_code}: {what}); "
                f"set {self.address.key_env} to a client key of it, or name the variable with --key-env"
            )
        return KeyRefused(f"the gateway at {self.address.origin} refused {key_words} ({response.status_code}: {what})")

    def _check(self, response: httpx.Response, path: str, key: Secret | None, key_words: str) -> Any:
        if response.status_code == 401:
            raise self._refused(response, key, key_words)
        if response.status_code == 404 and path in ("/capmon/info", "/capmon/snapshot", "/capmon/events"):
            raise GatewayError(
                f"{self._where(path)} answered 404: not a capmon gateway (is it `capmon serve`, "
                f"and is this its address?)"
            )
        if response.status_code >= 400:
            raise GatewayError(f"{self._where(path)} answered {response.status_code}: {_message(response)}")
        try:
            return response.json()
        except ValueError:
            raise GatewayError(
                f"{self._where(path)} answered {response.status_code} but not with JSON: not a capmon gateway"
            ) from None

    async def _get(self, path: str) -> Any:
        key = self.address.read_key
        try:
            response = await self._http.get(path, headers=self._headers(key))
        except httpx.TransportError as e:
            reason = _transport_reason(e)
            raise GatewayUnreachable(
                f"cannot reach the gateway at {self.address.origin}: {reason}; is `capmon serve` running there?", reason
            ) from None
        return self._check(response, path, key, self.address.describe_read_key())

    async def info(self) -> GatewayInfo:
        return GatewayInfo.from_json(await self._get("/capmon/info"), f"the gateway at {self.address.origin}")

    async def snapshot(self) -> EngineSnapshot:
        data = await self._get("/capmon/snapshot")
        try:
            return snapshot_from_json(data)
        except ValueError as e:
            raise GatewayError(f"{self.address.origin}/capmon/snapshot: {e}") from None

    async def act(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """POST an action (/capmon/trip, /capmon/pin, ...) with the admin key; its answer
        (what it changed: the targets' new states, or the pinned model)."""
        key = self.address.admin_key
        if key is None:
            raise KeyRefused(f"no admin key: set {self.address.admin_key_env} to the gateway's admin key")
        try:
            response = await self._http.post(path, json=dict(body), headers=self._headers(key))
        except httpx.TransportError as e:
            reason = _transport_reason(e)
            raise GatewayUnreachable(f"cannot reach the gateway at {self.address.origin}: {reason}", reason) from None
        if response.status_code == 403:
            raise KeyRefused(f"the gateway refused: {_message(response)}")
        data = self._check(response, path, key, f"the admin key in ${self.address.admin_key_env}")
        if not isinstance(data, Mapping) or data.get("ok") is not True:
            raise GatewayError(f"{self.address.origin}{path}: not an answer to an action")
        return data

    async def events(
        self,
        since: int | None = None,
        types: Collection[type[ev.Event]] | None = None,
    ) -> AsyncGenerator[tuple[int, ev.Event | None], None]:
        """The event stream from after event ``since`` (the gateway's recent history first
        when None): ``(number, event)``, the event None when this capmon does not know its
        type or it is not one of ``types`` (a busy gateway sends thousands a second, and
        only those asked for are decoded). Ends when the gateway ends the stream; raises
        GatewayUnreachable when it breaks."""
        wanted = None if types is None else frozenset(t.__name__ for t in types)
        key = self.address.read_key
        headers = self._headers(key) | {"accept": "text/event-stream"}
        if since is not None:
            headers["last-event-id"] = str(since)
        timeout = httpx.Timeout(TIMEOUT.connect or 3.0, read=STREAM_READ_TIMEOUT)
        try:
            async with self._http.stream("GET", "/capmon/events", headers=headers, timeout=timeout) as response:
                if response.status_code != 200:
                    await response.aread()
                    self._check(response, "/capmon/events", key, self.address.describe_read_key())
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    raise GatewayError(f"{self.address.origin}/capmon/events is no event stream: not a capmon gateway")
                # A frame the stream ends inside is incomplete and not read (as the SSE spec says).
                parser = SSEParser()
                async for piece in response.aiter_bytes():
                    for frame in parser.feed(piece):
                        if frame.id.isdigit() and frame.data:
                            wanted_one = wanted is None or frame.event in wanted
                            yield int(frame.id), _event(frame.data) if wanted_one else None
        except httpx.TransportError as e:
            reason = _transport_reason(e)
            raise GatewayUnreachable(
                f"the gateway's event stream at {self.address.origin} broke: {reason}", reason
            ) from None


def _event(data: str) -> ev.Event | None:
    try:
        return event_from_json(json.loads(data))
    except (ValueError, AttributeError):
        return None
