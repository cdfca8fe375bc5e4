"""The simulator's check of an AWS Signature Version 4 (``Authorization: AWS4-HMAC-SHA256
Credential=KEY/DATE/REGION/SERVICE/aws4_request, SignedHeaders=a;b, Signature=HEX``), as
boto3 signs a bedrock-runtime request. The access key id is the caller's key (one of the
scenario's); its secret is the same string, so the simulator can recompute the signature with
botocore's own signer over the request as it arrived (the raw path, the signed headers, the
body) and refuse one that does not match. Without botocore (the ``aws`` extra) only the
header's structure is checked. The request's age is not checked: the simulator's clock may be
a fast-forwarded loop's.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "bedrock"
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
    its path as sent, still percent-encoded; ``headers`` as received)."""
    try:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials
    except ImportError:  # pragma: no cover - the aws extra is not installed: the structure was checked
        return True
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
