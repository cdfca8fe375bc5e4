"""Raw client sockets for the gateway's connection tests: what a slow, idle, stalled or
malformed client does, below any HTTP library (which would not misbehave on purpose).
All of it on the running loop (the gateway serves in the same one)."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from typing import Any


async def connect(port: int, *, rcvbuf: int | None = None) -> socket.socket:
    """A connected non-blocking socket; ``rcvbuf``: its receive buffer (set before the
    handshake, so the window the server sees is that small)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


@dataclass(frozen=True)
class Received:
    data: bytes
    closed: bool  # the server closed (EOF or reset) within the time given

    @property
    def status(self) -> int | None:
        line = self.data.split(b"\r\n", 1)[0].split(b" ")
        return int(line[1]) if len(line) > 1 and line[1].isdigit() else None

    @property
    def headers(self) -> dict[str, str]:
        head = self.data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head)}

    def json(self) -> Any:
        return json.loads(self.data.split(b"\r\n\r\n", 1)[1])


async def receive(sock: socket.socket, seconds: float) -> Received:
    """What the server sends until it closes, or until ``seconds`` (loop time) pass."""
    loop = asyncio.get_running_loop()
    data = b""
    try:
        async with asyncio.timeout(seconds):
            while True:
                got = await loop.sock_recv(sock, 65536)
                if not got:
                    return Received(data, True)
                data += got
    except TimeoutError:
        return Received(data, False)
    except ConnectionResetError:
        return Received(data, True)


def request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    fields = {"host": "127.0.0.1", **{k.replace("_", "-"): v for k, v in headers.items()}}
    if body:
        fields.setdefault("content-length", str(len(body)))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode("latin-1") + body


def answers(data: bytes) -> list[bytes]:
    """The answers in ``data``, one after another, each whole (its head and its
    Content-Length of body): what a client reads back when it sent several requests on
    one connection. A count read from the text alone would be fooled by an error message
    that quotes a request line."""
    found = []
    while data:
        end = data.find(b"\r\n\r\n")
        assert end > 0 and data.startswith(b"HTTP/1.1 "), f"not an answer's head: {data[:200]!r}"
        length = Received(data[: end + 4], False).headers.get("content-length", "0")
        whole = end + 4 + int(length)
        assert len(data) >= whole, f"an answer cut short: {data[:300]!r}"
        found.append(data[:whole])
        data = data[whole:]
    return found
