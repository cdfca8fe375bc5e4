"""Every field the gateway reads from outside is parsed strictly, at the edge: a value it
cannot read is a 400 in the OpenAI shape naming the field, never a 500 and never a
request passed to the provider for it to make sense of (capmon/gateway/fields.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.gateway.helpers import HELLO, running

pytestmark = pytest.mark.looptime


def _octets(text: str) -> bytes:
    """A header value as a client may send it: latin-1 where it can be (what servers decode), else UTF-8."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode()


def _refused(r: httpx.Response, param: str | None) -> dict[str, Any]:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.headers["content-type"] == "application/json", r.headers
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param, body
    error: dict[str, Any] = body["error"]
    return error


async def test_an_event_number_that_is_no_bounded_number_is_a_400_never_a_500() -> None:
    many_digits = "7" * 5000  # past int()'s 4,300-digit limit: a ValueError on main
    async with running() as gw, gw.http() as http:
        answers = []
        for raw in (many_digits, "²", "1_0", "-1", "+3", " ", "1.5", "٣"):
            answers.append((raw, "since", await http.get("/capmon/events", params={"since": raw})))
        for raw in (many_digits, "²", "1_0", "x"):
            answers.append(
                (raw, "last-event-id", await http.get("/capmon/events", headers={"last-event-id": _octets(raw)}))
            )
    for raw, param, r in answers:
        err = _refused(r, param)
        assert "number of an event" in err["message"], (raw, err)
        assert many_digits not in err["message"]  # the value is quoted cut short


async def test_nan_and_infinity_are_refused_and_never_reach_the_provider() -> None:
    async with running() as gw, gw.http() as http:
        answers = []
        for literal in ("NaN", "Infinity", "-Infinity", "1e999"):
            text = json.dumps({"model": "auto", "messages": HELLO, "top_p": "X"}).replace('"X"', literal)
            answers.append((literal, await http.post("/v1/chat/completions", content=text.encode())))
        text = '{"model": "auto", "input": "hi", "temperature": NaN}'
        answers.append(("NaN", await http.post("/v1/responses", content=text.encode())))
        served = gw.client.snapshot().requests
    for literal, r in answers:
        err = _refused(r, None)
        assert literal.lstrip("-") in err["message"] and "JSON" in err["message"], err
    assert served == 0  # none of them was sent upstream


async def test_a_body_must_be_utf8_not_utf16_or_utf32_with_or_without_a_bom() -> None:
    text = json.dumps(
        {"model": "auto", "messages": [{"role": "user", "content": "un café, s'il vous plaît"}]}, ensure_ascii=False
    )
    async with running() as gw, gw.http() as http:
        refused = [
            (encoding, await http.post("/v1/chat/completions", content=text.encode(encoding)))
            for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1")
        ]
        refused.append(("bad utf-8", await http.post("/v1/chat/completions", content=text.encode()[:-3] + b"\xff}]}")))
        with_bom = await http.post("/v1/chat/completions", content=text.encode("utf-8-sig"))
    for encoding, r in refused[:-1]:
        err = _refused(r, None)
        assert "UTF-8" in err["message"], (encoding, err)
    assert "UTF-8" in _refused(refused[-1][1], None)["message"]
    assert with_bom.status_code == 200, with_bom.text  # RFC 8259 lets a reader ignore a UTF-8 BOM


@pytest.mark.parametrize(
    ("messages", "param", "says"),
    [
        (
            [{"role": "user", "content": 5}],
            "messages[0].content",
            "expected a string or a list of content parts, got int",
        ),
        ([{"role": "user", "content": "hi"}, {"content": "no role"}], "messages[1].role", "missing"),
        ([{"role": 7, "content": "hi"}], "messages[0].role", "expected a string, got int"),
        ([{"role": "user", "content": [5]}], "messages[0].content[0]", "got int"),
        ([{"role": "user", "content": [{"text": "hi"}]}], "messages[0].content[0].type", "got null"),
        ([{"role": "user", "content": {"text": "hi"}}], "messages[0].content", "got object"),
        ([{"role": "user", "content": "hi"}, "hello"], "messages[1]", "expected a message object, got string"),
        ([{"role": "user", "content": "hi", "name": ["x"]}], "messages[0].name", "got list"),
        ([{"role": "assistant", "content": None, "tool_calls": {}}], "messages[0].tool_calls", "got object"),
    ],
)
async def test_messages_with_wrong_inner_types_are_refused_naming_the_field(
    messages: list[Any], param: str, says: str
) -> None:
    async with running() as gw, gw.http() as http:
        r = await http.post("/v1/chat/completions", json={"model": "auto", "messages": messages})
        served = gw.client.snapshot().requests
    err = _refused(r, param)
    assert err["message"].startswith(f"{param}: ") and says in err["message"], err
    assert served == 0


async def test_the_other_fields_the_gateway_reads_are_checked_too() -> None:
    chat = {"model": "auto", "messages": HELLO}
    async with running() as gw, gw.http() as http:
        answers = [
            ("model", await http.post("/v1/chat/completions", json={**chat, "model": 5})),
            ("model", await http.post("/v1/chat/completions", json={**chat, "model": None})),
            ("stream", await http.post("/v1/chat/completions", json={**chat, "stream": "yes"})),
            ("max_tokens", await http.post("/v1/chat/completions", json={**chat, "max_tokens": 0})),
            ("max_tokens", await http.post("/v1/chat/completions", json={**chat, "max_tokens": 1.5})),
            ("temperature", await http.post("/v1/chat/completions", json={**chat, "temperature": "hot"})),
            ("input", await http.post("/v1/responses", json={"model": "auto", "input": 5})),
            ("input[0]", await http.post("/v1/responses", json={"model": "auto", "input": ["hi"]})),
            (
                "input[0].content",
                await http.post("/v1/responses", json={"model": "auto", "input": [{"role": "user", "content": 5}]}),
            ),
            ("input[0].role", await http.post("/v1/responses", json={"model": "auto", "input": [{"content": "hi"}]})),
            (
                "instructions",
                await http.post("/v1/responses", json={"model": "auto", "input": "hi", "instructions": 1}),
            ),
            ("max_output_tokens", await http.post("/v1/responses", json={"model": "auto", "max_output_tokens": -1})),
        ]
        # what OpenAI allows passes: content parts, an assistant's null content, the Responses API's item list
        parts = await http.post(
            "/v1/chat/completions",
            json={"model": "auto", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        )
        items = await http.post(
            "/v1/responses",
            json={
                "model": "auto",
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]},
                ],
            },
        )
        served = gw.client.snapshot().requests
    for param, r in answers:
        assert _refused(r, param)["message"].startswith(f"{param}: ")
    assert parts.status_code == 200, parts.text
    assert items.status_code == 200, items.text
    assert served == 2


async def test_the_per_request_headers_take_only_their_documented_forms() -> None:
    async with running() as gw, gw.http() as http:

        async def ask(**headers: str) -> httpx.Response:
            sent = {name: _octets(value) for name, value in headers.items()}
            return await http.post("/v1/chat/completions", headers=sent, json={"model": "auto", "messages": HELLO})

        refused = [
            ("x-capmon-deadline", raw, await ask(**{"x-capmon-deadline": raw}))
            for raw in ("1_0", "+5", "-1", "0", "0.0", "nan", "inf", "1e3", "٣", "10s", "1" * 5000, ".")
        ]
        refused += [
            ("x-capmon-priority", raw, await ask(**{"x-capmon-priority": raw}))
            for raw in ("urgent", "batch1", "", "inter active")
        ]
        taken = [
            await ask(**{"x-capmon-deadline": "30"}),
            await ask(**{"x-capmon-deadline": "2.5"}),
            await ask(**{"x-capmon-priority": "BATCH"}),
        ]
    for name, raw, r in refused:
        err = _refused(r, name)
        assert err["message"].startswith(f"{name}: expected"), (raw, err)
        assert len(err["message"]) < 300
    assert [r.status_code for r in taken] == [200, 200, 200]
    assert taken[2].headers["x-capmon-priority"] == "batch"
