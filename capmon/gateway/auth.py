"""Who is calling: a client key, the admin key, or nobody; compared in constant time.

A key comes as ``Authorization: Bearer KEY`` (what every OpenAI SDK sends), as
``x-api-key: KEY`` (Anthropic's) or as ``x-goog-api-key: KEY`` (Google's; its ``?key=``
is moved there by capmon/gateway/gemini_api.py). Without client keys the gateway is open (it then listens on
loopback only, capmon/gateway/serve.py sees to it) and any key a client sends is
ignored, since SDKs insist on sending one.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from capmon.core.types.result import Priority
from capmon.gateway.errors import ApiError
from capmon.gateway.settings import GatewaySettings


class Role(enum.StrEnum):
    ANONYMOUS = "anonymous"  # no key (or any key, on an open gateway)
    CLIENT = "client"
    ADMIN = "admin"


class Access(enum.Enum):
    OPEN = "open"  # /health, /ready
    USE = "use"  # the OpenAI API, /metrics and the control API's reads: a key when client keys exist
    ADMIN = "admin"  # the control API's actions


@dataclass(frozen=True, slots=True)
class Caller:
    role: Role
    alias: str | None = None  # the client key's alias
    priority: Priority = Priority.INTERACTIVE  # the key's priority: batch keys stay batch

    @property
    def admin(self) -> bool:
        return self.role is Role.ADMIN


ANONYMOUS = Caller(Role.ANONYMOUS)
ADMIN = Caller(Role.ADMIN, "admin")


def presented_key(headers: Mapping[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key") or headers.get("x-goog-api-key") or None


def _same(given: bytes, secret: str) -> bool:
    return hmac.compare_digest(given, secret.encode())


class Authenticator:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings

    def identify(self, headers: Mapping[str, str]) -> Caller | None:
        """The caller, or None for a key that is no key of this gateway (when it has keys)."""
        given = presented_key(headers)
        if given is None:
            return ANONYMOUS
        raw = given.encode("utf-8", "surrogateescape")
        found: Caller | None = None
        # Every key is compared, whichever matches, so the time taken does not say which.
        if self.settings.admin is not None and _same(raw, self.settings.admin.reveal()):
            found = ADMIN
        for k in self.settings.keys:
            if _same(raw, k.secret.reveal()) and found is None:
                found = Caller(Role.CLIENT, k.alias, k.priority)
        if found is not None:
            return found
        return ANONYMOUS if self.settings.open else None

    def require(self, headers: Mapping[str, str], access: Access) -> Caller:
        """The caller if it may have ``access``, else raises the 401 / 403 to answer."""
        if access is Access.OPEN:
            return ANONYMOUS
        caller = self.identify(headers)
        if caller is None:
            raise ApiError(
                401,
                "Incorrect API key provided. Use a client key of this gateway as "
                "Authorization: Bearer KEY or x-api-key: KEY.",
                "invalid_request_error",
                "invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
        if access is Access.ADMIN:
            if not caller.admin:
                what = (
                    "this gateway has no admin key (gateway.admin_key_env), so its control API is read-only"
                    if self.settings.admin is None
                    else "this action needs the gateway's admin key"
                )
                raise ApiError(403, what, "permission_error", "admin_key_required")
            return caller
        if caller.role is Role.ANONYMOUS and not self.settings.open:
            raise ApiError(
                401,
                "You didn't provide an API key. Send a client key of this gateway as "
                "Authorization: Bearer KEY or x-api-key: KEY.",
                "invalid_request_error",
                "invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
        return caller
