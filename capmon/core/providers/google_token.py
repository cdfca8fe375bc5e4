"""Google OAuth access tokens for an endpoint without a fixed key (Vertex AI's
``keys = []``): a service account's key file (``credentials_file``) or Application Default
Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's login, the metadata server), read
by google-auth (the ``google`` extra), sent as ``Authorization: Bearer`` by the per-request
hook (``dialect.Auth.sign``).

The credentials are loaded at the first request, not when the client starts: finding
Application Default Credentials may ask the metadata server, a network call a client's
constructor must not make. A token is refreshed once google-auth calls it stale, minutes
before it expires (``TokenState``), so no request carries one that expires on its way; the
refresh is a blocking HTTP call, made in a thread (``asyncio.to_thread``), one at a time
(requests that come meanwhile wait for it and share its token). Every token is held as a
secret (capmon/core/base/secrets.py) before any request carries it, and a failure's text
is redacted: no token reaches a log or an exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from capmon.core.base import secrets
from capmon.core.base.exceptions import CredentialsError
from capmon.core.base.extras import Extra, require

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.auth.transport.requests import Request as GoogleRequest

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


def require_google(what: str) -> None:
    """Raise MissingExtra unless google-auth is installed (``what``: who asks for it)."""
    require(Extra.GOOGLE, what)


def load(credentials_file: str = "") -> Credentials:
    """The service account's credentials in ``credentials_file``, or ("") the Application
    Default Credentials, for Vertex AI's scope (blocking: files, maybe the metadata server)."""
    import google.auth
    from google.oauth2 import service_account

    if credentials_file:
        return service_account.Credentials.from_service_account_file(credentials_file, scopes=SCOPES)  # type: ignore[no-untyped-call,no-any-return]
    credentials, _project = google.auth.default(scopes=SCOPES)
    return credentials


class TokenSource:
    """The access tokens of one target's credentials (``loader`` makes them: :func:`load`)."""

    def __init__(self, loader: Callable[[], Credentials], what: str) -> None:
        self._loader = loader
        self._what = what  # who holds them, for errors: 'endpoint "vertex" (api = "vertex")'
        self._credentials: Credentials | None = None
        self._transport: GoogleRequest | None = None
        self._lock = asyncio.Lock()

    async def sign(self, request: httpx.Request) -> None:
        """``Auth.sign``: the current token (and a quota project's header, where the
        credentials name one) on ``request``."""
        headers: dict[str, str] = {}
        credentials = self._credentials
        if credentials is None or not _fresh(credentials):
            credentials = await self._refreshed()
        credentials.apply(headers)  # type: ignore[no-untyped-call]
        request.headers.update(headers)

    async def _refreshed(self) -> Credentials:
        """The credentials with a fresh token: loaded and refreshed by one request at a time."""
        async with self._lock:
            credentials = self._credentials
            if credentials is not None and _fresh(credentials):
                return credentials  # another request refreshed them while this one waited
            try:
                if credentials is None:
                    credentials = self._credentials = await asyncio.to_thread(self._loader)
                if not _fresh(credentials):
                    await asyncio.to_thread(credentials.refresh, self._request())
            except Exception as e:  # google-auth's own errors, and the files' and network's
                raise CredentialsError(_failure_text(self._what, e)) from None
            if credentials.token:
                secrets.register(credentials.token)
            return credentials

    def _request(self) -> GoogleRequest:
        """google-auth's HTTP transport, made once (in the refreshing thread: it opens a session)."""
        if self._transport is None:
            from google.auth.transport.requests import Request

            self._transport = Request()
        return self._transport


def _fresh(credentials: Credentials) -> bool:
    from google.auth.credentials import TokenState

    return credentials.token_state is TokenState.FRESH


def _failure_text(what: str, e: Exception) -> str:
    """Why ``what``'s token could not be had, redacted: a token endpoint's answer may echo a credential."""
    detail = secrets.redact(str(e))[:300]
    return f"{what}: no Google access token ({type(e).__name__}: {detail})"
