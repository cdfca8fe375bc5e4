"""The HTTP transport under httpx's API (placeholder until the aiohttp transport lands)."""

from __future__ import annotations

import httpx


def make_transport(kind: str, *, max_connections: int, connect_timeout: float) -> httpx.AsyncBaseTransport:
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncHTTPTransport(limits=limits)
