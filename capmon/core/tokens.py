"""The one prompt-size estimate: the client charges tpm buckets and checks context
windows with it, and the simulator counts prompt tokens with it, so both sides of a
test agree on what a prompt costs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

# Role and framing: OpenAI's own accounting adds about this many tokens per message.
PER_MESSAGE = 4


def tokens_for_chars(chars: int) -> int:
    """About four characters a token."""
    return math.ceil(chars / 4)


def estimate_tokens(messages: Iterable[Any]) -> int:
    """About four characters a token over the text of the messages (string content or
    text parts), plus the framing of each message. Anything else counts nothing."""
    chars = 0
    n = 0
    for m in messages:
        n += 1
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    chars += len(part["text"])
    return tokens_for_chars(chars) + PER_MESSAGE * n
