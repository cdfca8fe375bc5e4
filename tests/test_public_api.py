"""The public API (``capmon``) keeps the names users import: an old one is still served,
with a DeprecationWarning naming the new one."""

from __future__ import annotations

import pytest

import capmon


def test_chat_request_is_request_now_and_says_so() -> None:
    with pytest.warns(DeprecationWarning, match=r"capmon\.ChatRequest is capmon\.Request now"):
        old = capmon.ChatRequest  # type: ignore[attr-defined]
    assert old is capmon.Request
    assert old.of("hi").messages == ({"role": "user", "content": "hi"},)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        capmon.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
