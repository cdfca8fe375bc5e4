"""AWS's event stream (``application/vnd.amazon.eventstream``) written, as Bedrock's
ConverseStream sends it, for what speaks Bedrock's stream to a client: the gateway's
ConverseStream (capmon/gateway/sse.py) and the simulator's. Reading is botocore's maintained
decoder (aws_eventstream.py): nothing here parses. each message is ``[total length u32][headers length u32][prelude
CRC32][headers][payload][message CRC32]``, big-endian, the CRCs zlib's CRC-32 (the prelude's
over the first 8 bytes, the message's over everything before it). A header is ``[name length
u8][name][type u8][value]``; the simulator sends string values only (type 7, ``[length
u16][utf-8]``), as Bedrock does. The tests read it back with botocore's own decoder, which checks both CRCs.

An event carries ``:event-type``, ``:content-type: application/json`` and ``:message-type:
event``; an error inside the stream ``:message-type: exception`` with ``:exception-type`` (the
exception's name in lowerCamel case, such as ``throttlingException``), or an error of the
stream itself ``:message-type: error`` with ``:error-code`` and ``:error-message`` headers and
an empty payload. Every event's payload carries
a padding field ``p`` of random length, as AWS pads its events so their sizes say nothing
about their content.
"""

from __future__ import annotations

import json
import random
import struct
import zlib
from collections.abc import Mapping
from typing import Any

MEDIA_TYPE = "application/vnd.amazon.eventstream"
STRING = 7  # the header value type of a UTF-8 string
PRELUDE = struct.Struct(">II")
CRC = struct.Struct(">I")
# What AWS pads with: a prefix of this alphabet.
_PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return bytes([len(raw_name)]) + raw_name + bytes([STRING]) + struct.pack(">H", len(raw_value)) + raw_value


def frame(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message."""
    raw_headers = b"".join(_header(k, v) for k, v in headers.items())
    total = PRELUDE.size + CRC.size + len(raw_headers) + len(payload) + CRC.size
    prelude = PRELUDE.pack(total, len(raw_headers))
    head = prelude + CRC.pack(zlib.crc32(prelude)) + raw_headers + payload
    return head + CRC.pack(zlib.crc32(head))


def padded(payload: Mapping[str, Any], rng: random.Random | None = None) -> bytes:
    """``payload`` as JSON with its padding field ``p``."""
    length = (rng or random).randint(1, len(_PADDING))
    return json.dumps({**payload, "p": _PADDING[:length]}, separators=(",", ":")).encode()


def event(event_type: str, payload: Mapping[str, Any]) -> bytes:
    """An event message (``messageStart``, ``contentBlockDelta``...)."""
    headers = {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}
    return frame(headers, padded(payload))


def exception(exception_type: str, payload: Mapping[str, Any]) -> bytes:
    """An error inside the stream: ``exception_type`` is lowerCamel (``throttlingException``)."""
    headers = {":exception-type": exception_type, ":content-type": "application/json", ":message-type": "exception"}
    return frame(headers, json.dumps(payload).encode())


def error(code: str, message: str) -> bytes:
    """An error of the stream itself: ``code`` as AWS names it (``ThrottlingException``), the
    words in a header, no payload (botocore raises it as ``EventStreamError`` with that code)."""
    return frame({":error-code": code, ":error-message": message, ":message-type": "error"}, b"")
