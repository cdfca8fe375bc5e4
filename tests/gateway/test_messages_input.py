"""What /v1/messages refuses at the edge, in Anthropic's error shape with the field named:
the same strict JSON as the OpenAI routes (UTF-8 only, no NaN), and the inner types of a
Messages body; the anthropic-version header; the browser checks; 404 and 405 on its paths."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.helpers import running

pytestmark = pytest.mark.looptime

HI = [{"role": "user", "content": "hi"}]
OK = {"model": "auto", "max_tokens": 10, "messages": HI}


def _anthropic_error(body: Any) -> dict[str, Any]:
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}, body
    error: dict[str, Any] = body["error"]
    return error


BODIES: list[tuple[Any, str]] = [
    ({k: v for k, v in OK.items() if k != "max_tokens"}, "max_tokens: Field required"),
    ({**OK, "max_tokens": "10"}, "max_tokens: expected a whole number"),
    ({**OK, "max_tokens": True}, "max_tokens: expected a whole number"),
    ({**OK, "model": 7}, "model: expected a string"),
    ({k: v for k, v in OK.items() if k != "model"}, "model parameter"),
    ({**OK, "messages": []}, "messages: expected a non-empty list"),
    ({**OK, "messages": "hi"}, "messages: expected a non-empty list"),
    ({**OK, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role: expected 'user', 'assistant' or"),
    ({**OK, "messages": [*HI, {"role": "system", "content": 5}]}, "messages[1].content: expected a string or a list"),
    (
        {**OK, "messages": [*HI, {"role": "system", "content": [{"type": "image"}]}]},
        "messages[1].content[0]: expected a text block",
    ),
    ({**OK, "messages": [{"content": "x"}]}, "messages[0].role: missing"),
    ({**OK, "messages": [{"role": "user", "content": 5}]}, "messages[0].content: expected a string or a list"),
    ({**OK, "messages": [{"role": "user"}]}, "messages[0].content: expected a string or a list"),
    ({**OK, "messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]: expected a content part"),
    ({**OK, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0].type"),
    ({**OK, "system": 3}, "system: expected a string or a list of text blocks"),
    ({**OK, "system": [{"type": "image"}]}, "system[0]: expected a text block"),
    ({**OK, "system": [{"type": "text", "text": None}]}, "system[0].text: expected a string"),
    ({**OK, "stream": "yes"}, "stream: expected true or false"),
    ({**OK, "temperature": "hot"}, "temperature: expected a number"),
    ({**OK, "top_k": 0}, "top_k: expected a whole number"),
    ({**OK, "stop_sequences": "END"}, "stop_sequences: expected a list of strings"),
    ({**OK, "stop_sequences": [1]}, "stop_sequences[0]: expected a string"),
    ({**OK, "tools": {"name": "x"}}, "tools: expected a list of objects"),
    ({**OK, "tool_choice": "auto"}, "tool_choice: expected an object"),
    ({**OK, "tool_choice": {"name": "x"}}, "tool_choice.type: expected a string"),
]


async def test_bad_messages_bodies_are_400s_in_anthropics_shape_naming_the_field() -> None:
    async with running() as gw, gw.http() as http:
        for body, words in BODIES:
            r = await http.post("/v1/messages", json=body)
            assert r.status_code == 400, (body, r.text)
            err = _anthropic_error(r.json())
            assert err["type"] == "invalid_request_error" and words in err["message"], (body, err)
        counted = await http.post("/v1/messages/count_tokens", json={"model": "auto", "messages": [{"role": "x"}]})
        assert counted.status_code == 400 and "messages[0].role" in _anthropic_error(counted.json())["message"]
        raws = [
            b'{"model": "auto", "max_tokens": 10, "messages": [], "temperature": NaN}',
            '{"model": "auto"}'.encode("utf-16"),
            b'{"model": "\xff"}',
            b"[1, 2]",
            b"",
        ]
        for raw in raws:
            r = await http.post("/v1/messages", content=raw)
            assert r.status_code == 400 and _anthropic_error(r.json())["type"] == "invalid_request_error", raw
        assert gw.client.snapshot().succeeded == 0  # nothing reached a model


async def test_the_version_header_both_versions_an_unknown_one_and_the_routes_own_errors() -> None:
    async with running(gateway="max_body_bytes = 2048") as gw, gw.http() as http:
        served = [
            (await http.post("/v1/messages", json=OK, headers={"anthropic-version": v})).status_code
            for v in ("2023-06-01", "2026-10-21")
        ]
        unknown = await http.post("/v1/messages", json=OK, headers={"anthropic-version": "2020-01-01"})
        missing_model = await http.post("/v1/messages", json={**OK, "model": "claude-9"})
        too_large = await http.post("/v1/messages", json={**OK, "messages": [{"role": "user", "content": "x" * 4000}]})
        no_route = await http.post("/v1/messages/batches", json={})
        wrong_method = await http.get("/v1/messages")
        from_a_page = await http.post("/v1/messages", json=OK, headers={"origin": "https://evil.example"})
        not_json = await http.post("/v1/messages", content=b"{}", headers={"content-type": "text/plain"})
    assert served == [200, 200]
    assert unknown.status_code == 400 and "anthropic-version" in _anthropic_error(unknown.json())["message"]
    for r, status, kind in (
        (missing_model, 404, "not_found_error"),
        (too_large, 413, "request_too_large"),
        (no_route, 404, "not_found_error"),
        (wrong_method, 405, "invalid_request_error"),
        (from_a_page, 403, "permission_error"),
        (not_json, 403, "permission_error"),
    ):
        assert r.status_code == status and _anthropic_error(r.json())["type"] == kind, r.text
