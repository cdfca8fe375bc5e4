"""Headers, each worked out once: those that say who served, as a plain answer's start
carries them (``Served.raw``: the same names, values and order as ``Served.headers``,
encoded), and a request's, read once for the layers that read them in turn."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from capmon.core.types.result import Priority
from capmon.gateway.headers import Served
from capmon.gateway.inbound import header_map, read_headers
from capmon.gateway.replies import _raw

SERVED = [
    Served("m", "e", "m@e/k", 1, 0, 7),
    Served("gpt-4o", "azure-eu", "gpt-4o@azure-eu/main", 3, 2, 123456, "azure", deployment="gpt-4o-prod"),
    Served(
        "m",
        "e",
        "m@e/k",
        2,
        1,
        9,
        "anthropic",
        dropped=("temperature", "top_p"),
        max_tokens=4096,
        skipped="a@e/k=open (breaker open); b@e/k=incapable (no tools)",
        deployment="claude",
    ),
    Served("modèle-ü", "端点", "modèle-ü@端点/k", 1, 0, 1, "openai", skipped="x=y (ü 端)", deployment="端"),
    Served("", "", "", 1, 0, 0),
]


@pytest.mark.unit
@pytest.mark.parametrize("served", SERVED)
@pytest.mark.parametrize("priority", list(Priority))
def test_raw_headers_are_the_headers_encoded(served: Served, priority: Priority) -> None:
    assert served.raw(priority) == _raw(served.headers(priority))
    assert served.raw(priority) == _raw(served.headers(priority))  # once more, from the cache


@pytest.mark.parametrize(
    "raw",
    [
        [(b"host", b"127.0.0.1"), (b"origin", b"http://a"), (b"content-type", b"application/json")],
        [(b"host", b"a"), (b"host", b"b"), (b"x-\xc0", b"\xe9")],
        [(b"Host", b"evil"), (b"host", b"127.0.0.1"), (b"ORIGIN", b"http://a")],
    ],
)
def test_the_headers_read_once_are_what_each_layer_read_before(raw: list[tuple[bytes, bytes]]) -> None:
    scope = {"type": "http", "headers": raw}
    headers, lower = read_headers(scope)
    assert headers == header_map(scope) and read_headers(scope) == (headers, lower)  # the second read: the first's
    assert lower == all(name == name.lower() for name, _ in raw)
    if lower:  # the browser checks read the map only then: a lookup finds what Starlette's Headers finds
        starlette = Headers(scope=scope)
        for name in ("host", "origin", "content-type", "content-length", "transfer-encoding"):
            assert headers.get(name) == starlette.get(name) and (name in headers) == (name in starlette)
