"""AWS's event stream (``application/vnd.amazon.eventstream``) written: one message as its
bytes, ``[total u32][headers u32][prelude CRC32][headers][payload][message CRC32]``, every
header a string (type 7). What speaks Bedrock's stream to a client writes with it: the
gateway's ConverseStream (capmon/gateway/bedrock_api.py) and the simulator's. Reading is
botocore's maintained decoder (capmon/core/providers/aws_eventstream.py): nothing here
parses.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any

STRING = 7  # a header value's type: a UTF-8 string with a 2-byte length
CONTENT_TYPE = "application/vnd.amazon.eventstream"


def message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message: ``headers`` (names and string values) and ``payload``."""
    head = b"".join(
        struct.pack(">B", len(name)) + name + struct.pack(">BH", STRING, len(value)) + value
        for name, value in ((k.encode(), v.encode()) for k, v in headers.items())
    )
    prelude = struct.pack(">II", 12 + len(head) + len(payload) + 4, len(head))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


def event(kind: str, payload: Mapping[str, Any]) -> bytes:
    """An event (``:message-type: event``) of type ``kind`` with a JSON payload."""
    headers = {":event-type": kind, ":content-type": "application/json", ":message-type": "event"}
    return message(headers, json.dumps(payload, separators=(",", ":")).encode())


def exception(kind: str, text: str) -> bytes:
    """An exception (``:message-type: exception``) of type ``kind`` (lowerCamel, as AWS names
    them in a stream: ``throttlingException``), its message in a JSON payload."""
    headers = {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"}
    return message(headers, json.dumps({"message": text}, separators=(",", ":")).encode())
