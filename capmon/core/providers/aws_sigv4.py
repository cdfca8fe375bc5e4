"""AWS Signature Version 4 for an endpoint without a fixed key (Bedrock's ``keys = []``):
credentials from the standard AWS chain (environment variables, the shared config and
credentials files and their profiles, SSO, a container's or an instance's role), found and
refreshed by botocore (the ``aws`` extra), each request signed by botocore's own signer
(``SigV4Auth``) in the per-request hook (``dialect.Auth.sign``), over its final method,
URL, ``content-type`` and body.

The chain is read at the first request, not when the client starts: it may ask an
instance's metadata service, a network call a client's constructor must not make. Temporary
credentials (a role's, SSO's) are refreshed by botocore minutes before they expire; a
refresh may be a blocking HTTP call, so it is made in a thread (``asyncio.to_thread``), one
at a time; credentials that need none are read in place. The secret key and the session
token are held as secrets (capmon/core/base/secrets.py) before any request is signed with
them, and a failure's text is redacted: neither reaches a log or an exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from capmon.core.base import secrets
from capmon.core.base.exceptions import CredentialsError

if TYPE_CHECKING:
    from botocore.credentials import Credentials, ReadOnlyCredentials

SERVICE = "bedrock"
# What a signature covers besides the URL's host and its own date and token headers: the
# content type the body is read as (the body itself through its hash).
_SIGNED = ("content-type",)
# What the signer adds, which the request then carries.
_ADDED = ("authorization", "x-amz-date", "x-amz-security-token")


def load() -> Credentials | None:
    """The credentials the standard chain finds, or None (blocking: files, maybe the network)."""
    from botocore.session import Session

    return Session().get_credentials()


class Signer:
    """Signs one target's requests for ``region`` with the credentials ``loader`` finds
    (:func:`load`); ``what`` names who holds them, for errors:
    ``endpoint "bedrock" (api = "bedrock", keys = [])``."""

    def __init__(self, region: str, what: str, loader: Callable[[], Credentials | None] = load) -> None:
        self._region = region
        self._what = what
        self._loader = loader
        self._credentials: Credentials | None = None
        self._lock = asyncio.Lock()

    async def sign(self, request: httpx.Request) -> None:
        """``Auth.sign``: ``request`` (its body final) signed for Bedrock in the region."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        frozen = await self._frozen()
        headers = {name: request.headers[name] for name in _SIGNED if name in request.headers}
        signed = AWSRequest(method=request.method, url=str(request.url), data=request.content, headers=headers)
        SigV4Auth(frozen, SERVICE, self._region).add_auth(signed)
        for name in _ADDED:
            value = signed.headers.get(name)
            if value is not None:
                request.headers[name] = value

    async def _frozen(self) -> ReadOnlyCredentials:
        """The credentials as of now: read in place when no refresh is due, else loaded or
        refreshed in a thread by one request at a time."""
        credentials = self._credentials
        if credentials is not None and not _due(credentials):
            return credentials.get_frozen_credentials()
        async with self._lock:
            try:
                if self._credentials is None:
                    self._credentials = await asyncio.to_thread(self._loader)
                    if self._credentials is None:
                        raise CredentialsError(
                            f"{self._what}: no AWS credentials found (AWS_ACCESS_KEY_ID and"
                            " AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials, SSO, or the"
                            " instance's role); or give a Bedrock API key in keys"
                        )
                frozen = await asyncio.to_thread(self._credentials.get_frozen_credentials)
            except CredentialsError:
                raise
            except Exception as e:  # botocore's own errors, and the files' and network's
                raise CredentialsError(_failure_text(self._what, e)) from None
        for value in (frozen.secret_key, frozen.token):
            if value:
                secrets.register(value)
        return frozen


def _due(credentials: Credentials) -> bool:
    """Whether reading ``credentials`` may refresh them (a blocking call): temporary ones
    whose refresh botocore would make now."""
    from botocore.credentials import RefreshableCredentials

    return isinstance(credentials, RefreshableCredentials) and credentials.refresh_needed()


def _failure_text(what: str, e: Exception) -> str:
    """Why ``what``'s credentials could not be had, redacted: a provider's answer may echo one."""
    detail = secrets.redact(str(e))[:300]
    return f"{what}: no AWS credentials ({type(e).__name__}: {detail})"
