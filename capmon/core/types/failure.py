"""What a failed attempt came to: its kind (:class:`Kind`), why no connection was made
(:class:`Cause`), and the :class:`Failure` every layer reads. The classifier that makes
them from a response, an exception or a stream event is capmon/core/providers/classify.py."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from capmon.core.types.capability import Feature


class Kind(enum.StrEnum):
    CAPACITY = "capacity"
    RATE_LIMITED = "rate_limited"
    QUOTA = "quota"
    AUTH = "auth"
    TOO_LARGE = "too_large"
    BAD_REQUEST = "bad_request"
    TRANSIENT = "transient"
    OVERSIZED = "oversized"  # an answer past client.max_response_bytes: reading stopped there
    # No connection was made (DNS, refused, TLS, proxy, connect timeout): the request never
    # reached the server, so it says nothing of the model's capacity; ``Failure.code`` is the
    # :class:`Cause`.
    UNREACHABLE = "unreachable"


class Cause(enum.StrEnum):
    """Why an endpoint could not be reached: an unreachable failure's ``code``."""

    DNS = "dns_failed"
    REFUSED = "connection_refused"
    TLS = "tls_failed"
    PROXY = "proxy_failed"
    TIMEOUT = "connect_timeout"
    NETWORK = "connect_failed"  # no route, network down, or a connect error with no more detail

    @property
    def label(self) -> str:
        return _CAUSE_LABELS[self]


_CAUSE_LABELS = {
    Cause.DNS: "DNS lookup failed",
    Cause.REFUSED: "connection refused",
    Cause.TLS: "TLS handshake failed",
    Cause.PROXY: "proxy error",
    Cause.TIMEOUT: "timeout: connect",
    Cause.NETWORK: "connection failed",
}


# A stream (or a request) that kept quiet past its limits (ARCHITECTURE.md, "Streams"): each
# a ``Failure.code`` on the kind that says what the client does with it (policy.py).
SILENT = "silent"  # capacity: no response headers within the limit; its breaker opens at once
FIRST_TOKEN = "first_token_timeout"  # capacity: headers, but no output within the limit
STALLED = "stalled"  # transient: no bytes for stall_timeout after output began (like a cut)
# A bad request whose 404 says the target's model (or Azure deployment) is not there: the
# target is parked and the request goes on to another deployment or model (policy.py).
MODEL_NOT_FOUND = "model_not_found"
# A bad request that says the target's model id cannot be called on demand, only through an
# inference profile (Bedrock's newer models): a configuration error of the target, parked as
# a missing model is (policy.py), its reason saying which id to use instead.
INFERENCE_PROFILE_REQUIRED = "inference_profile_required"
# A bad request whose 400 says the target's model does not support a feature the request
# uses (tools, structured output, images, reasoning; ``Failure.feature`` names it): that
# deployment is marked as lacking it for the process and the request goes on (policy.py).
UNSUPPORTED_FEATURE = "unsupported_feature"


@dataclass(frozen=True, slots=True)
class Failure:
    kind: Kind
    reason: str
    status: int | None = None
    code: str | None = None
    retry_after: float | None = None  # seconds, from a server hint; None when there was none
    # The provider's own message (keys redacted, up to MESSAGE_CHARS) and the parameter it
    # names, for passing an error through as the provider said it (the gateway's 4xx).
    message: str = ""
    param: str | None = None
    feature: Feature | None = None  # code UNSUPPORTED_FEATURE: the feature the model lacks
