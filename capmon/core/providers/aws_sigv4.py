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

The other side, for what takes signed requests (the gateway's Bedrock routes, the
simulator's): :func:`parse` takes an ``Authorization`` header apart and :func:`verify`
recomputes its signature with the secret the caller's key id stands for.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from capmon.core.base import secrets
from capmon.core.base.exceptions import CredentialsError
from capmon.core.base.extras import Extra, require

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


# ---------------------------------------------------------------- checking a signature

ALGORITHM = "AWS4-HMAC-SHA256"
_FIELDS = re.compile(r"(Credential|SignedHeaders|Signature)=([^,\s]+)")
_SCOPE = re.compile(r"^([^/]+)/(\d{8})/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request$")
_SIGNATURE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Signed:
    """What a SigV4 ``Authorization`` header says."""

    access_key: str
    date: str  # YYYYMMDD, the credential scope's
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str


def parse(authorization: str) -> Signed | None:
    """The header's parts, or None when it is not a well-formed SigV4 header for Bedrock
    (another algorithm, a scope that is not ``KEY/DATE/REGION/bedrock/aws4_request``, no
    ``host`` among the signed headers, a signature that is not 64 hex digits)."""
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    fields = dict(_FIELDS.findall(rest))
    scope = _SCOPE.match(fields.get("Credential", ""))
    signed = tuple(fields.get("SignedHeaders", "").split(";"))
    if scope is None or scope[4] != SERVICE or "host" not in signed:
        return None
    if not _SIGNATURE.match(fields.get("Signature", "")):
        return None
    return Signed(scope[1], scope[2], scope[3], scope[4], signed, fields["Signature"])


def verify(signed: Signed, secret: str, method: str, url: str, headers: Mapping[str, str], body: bytes) -> bool:
    """Whether ``signed.signature`` is the one ``secret`` gives this request (``url`` with
    its path as sent, still percent-encoded; ``headers`` as received), recomputed by
    botocore's own signer at the time the request says it was signed. Raises
    :class:`~capmon.core.base.exceptions.MissingExtra` without the ``aws`` extra."""
    require(Extra.AWS, "checking a SigV4 signature")
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    timestamp = headers.get("x-amz-date", "")
    if not timestamp.startswith(signed.date):
        return False
    kept = {name: headers.get(name, "") for name in signed.signed_headers}
    request = AWSRequest(method=method, url=url, headers=kept, data=body)
    request.context["timestamp"] = timestamp
    signer = SigV4Auth(Credentials(signed.access_key, secret), signed.service, signed.region)
    canonical = signer.canonical_request(request)
    expected: str = signer.signature(signer.string_to_sign(request, canonical), request)
    return hmac.compare_digest(expected, signed.signature)
