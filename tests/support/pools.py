"""What a capmon transport's connection pool holds now (capmon/core/routing/transport.py): read from
httpx's pool, and from aiohttp's connector, which keeps no public count (aiohttp 3.14's
attributes; the dependency is pinned)."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import httpx

from capmon.core.routing.transport import HttpcoreTransport
from capmon.core.routing.transport_aiohttp import AiohttpTransport


@dataclass(frozen=True)
class PoolStats:
    open: int  # connections held, serving a request or idle
    in_use: int  # of those, serving a request (or being opened for one)


def pool_stats(transport: httpx.AsyncBaseTransport) -> PoolStats:
    if isinstance(transport, HttpcoreTransport):
        connections = transport._pool.connections
        return PoolStats(open=len(connections), in_use=sum(1 for c in connections if not c.is_idle()))
    assert isinstance(transport, AiohttpTransport), transport
    if not isinstance(transport.client, aiohttp.ClientSession) or transport.client.connector is None:
        return PoolStats(open=0, in_use=0)  # no request yet: no session, no pool
    connector = transport.client.connector
    # the connections serving requests, and the idle ones per host
    in_use = len(getattr(connector, "_acquired", ()))
    idle = sum(len(q) for q in getattr(connector, "_conns", {}).values())
    return PoolStats(open=in_use + idle, in_use=in_use)
