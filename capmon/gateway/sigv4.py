"""Who signed a SigV4 request to the gateway's Bedrock routes (boto3's bedrock-runtime
client signs every request so, with the credentials it is given).

A gateway with client keys takes a client's key as the *secret* of its AWS credentials and
the key's alias as their access key id (``aws_access_key_id="team", aws_secret_access_key=
KEY``): the key itself never travels; the signature over the method, path, signed headers
and body proves it. The check recomputes the signature with botocore's own signer (the
``aws`` extra) at the time the request says it was signed, and compares in constant time.
A request whose signature does not check out is no caller of the gateway's (401). A gateway
without client keys checks nothing: any signature, or none, is taken, as any key is on the
other routes.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from capmon.core.base.extras import Extra, require

# Authorization: AWS4-HMAC-SHA256 Credential=KEYID/20261205/us-east-1/bedrock/aws4_request,
#   SignedHeaders=content-type;host;x-amz-date, Signature=<64 hex>
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<key>[^/\s,]+)/(?P<date>\d{8})/(?P<region>[^/\s,]+)/(?P<service>[^/\s,]+)"
    r"/aws4_request,\s*SignedHeaders=(?P<signed>[a-z0-9;-]+),\s*Signature=(?P<signature>[0-9a-f]{64})$"
)
SCHEME = "AWS4-HMAC-SHA256"


@dataclass(frozen=True, slots=True)
class Signed:
    """A SigV4 Authorization header, taken apart."""

    key_id: str
    region: str
    service: str
    signed: tuple[str, ...]
    signature: str


def parse(authorization: str) -> Signed | None:
    """The parts of a SigV4 ``Authorization`` header, or None when it is none."""
    m = _AUTHORIZATION.match(authorization.strip())
    if m is None:
        return None
    return Signed(m["key"], m["region"], m["service"], tuple(m["signed"].split(";")), m["signature"])


def verified(
    signed: Signed,
    secret_of: Callable[[str], str | None],
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
) -> bool:
    """Whether ``signed`` is a signature of this request by the secret of its access key id
    (``secret_of``: the client key whose alias it is, or None)."""
    secret = secret_of(signed.key_id)
    stamp = headers.get("x-amz-date", "")
    if secret is None or not stamp or "host" not in signed.signed:
        return False
    require(Extra.AWS, "a SigV4-signed request to the gateway's Bedrock routes")
    from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
    from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
    from botocore.credentials import Credentials  # type: ignore[import-untyped]

    request = AWSRequest(method=method, url=url, data=body, headers={h: headers.get(h, "") for h in signed.signed})
    request.context["timestamp"] = stamp
    signer = SigV4Auth(Credentials(signed.key_id, secret), signed.service, signed.region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    return hmac.compare_digest(expected, signed.signature)
