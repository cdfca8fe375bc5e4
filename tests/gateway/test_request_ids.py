"""Request ids, honest fallback headers and a fresh Date (issue 18, items 1, 3 and 7), with
the real openai and anthropic SDKs against a real gateway on the simulator."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from email.utils import parsedate_to_datetime
from pathlib import Path

import openai
import pytest

from capmon import audit
from capmon.core.base.clock import default_clock
from capmon.core.types import events as ev
from capmon.core.types.result import Attempt, Decision, Request
from tests.gateway.helpers import HELLO, running, scenario, sse_frames

NEW_ID = re.compile(r"req_[0-9a-f]{24}")


@pytest.mark.looptime
async def test_every_reply_has_an_x_request_id_which_the_openai_sdk_reads() -> None:
    async with running() as gw, gw.openai() as sdk, gw.http() as http:
        plain = await sdk.chat.completions.create(model="auto", messages=HELLO)
        raw = await sdk.chat.completions.with_raw_response.create(model="auto", messages=HELLO, stream=True)
        async for _ in raw.parse():
            pass
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.chat.completions.create(model="no-such-model", messages=HELLO)
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.chat.completions.create(model="auto", messages=[])
        routes = [await http.get("/nowhere"), await http.get("/health"), await http.get("/v1/models")]
        # every model failing: a 5xx (or the 429 of capacity) within the request's deadline
        for model in ("flagship", "medium", "small"):
            await gw.sim_admin(f"outage/sim-{model}", {"duration": 60})
        failed = await http.post(
            "/v1/chat/completions", headers={"x-capmon-deadline": "2"}, json={"model": "auto", "messages": HELLO}
        )
        events = gw.client.bus.recent(types=[ev.RequestDone])
    assert plain._request_id is not None and NEW_ID.fullmatch(plain._request_id)
    assert NEW_ID.fullmatch(raw.headers["x-request-id"]) and raw.headers["x-request-id"] != plain._request_id
    assert missing.value.request_id is not None and NEW_ID.fullmatch(missing.value.request_id)
    assert bad.value.request_id is not None and NEW_ID.fullmatch(bad.value.request_id)
    assert [r.status_code for r in routes] == [404, 200, 200]
    assert all(NEW_ID.fullmatch(r.headers["x-request-id"]) for r in routes)
    assert failed.status_code >= 429 and NEW_ID.fullmatch(failed.headers["x-request-id"])
    # the request's events carry the same id
    done = {e.caller_request_id for e in events if isinstance(e, ev.RequestDone)}
    assert {plain._request_id, raw.headers["x-request-id"], failed.headers["x-request-id"]} <= done


@pytest.mark.looptime
async def test_a_clients_own_id_is_kept_when_sane_and_replaced_when_not() -> None:
    async with running() as gw, gw.openai() as sdk, gw.http() as http:
        own = await sdk.chat.completions.with_raw_response.create(
            model="auto", messages=HELLO, extra_headers={"x-request-id": "trace-42/a.b:c"}
        )
        client = await http.post(
            "/v1/chat/completions", headers={"x-client-request-id": "cli-7"}, json={"model": "auto", "messages": HELLO}
        )
        refused = [
            await http.post("/v1/chat/completions", headers={"x-request-id": bad}, json={"model": "nope"})
            for bad in ("has space", "x" * 129, "tab\there", "")
        ]
        started = gw.client.bus.recent(types=[ev.AttemptStarted])
    assert own.headers["x-request-id"] == "trace-42/a.b:c"
    assert client.headers["x-request-id"] == "cli-7"
    assert [r.status_code for r in refused] == [404] * 4  # a bad id is replaced, never a reason to refuse
    assert all(NEW_ID.fullmatch(r.headers["x-request-id"]) for r in refused)
    assert {"trace-42/a.b:c", "cli-7"} <= {e.caller_request_id for e in started if isinstance(e, ev.AttemptStarted)}


@pytest.mark.looptime
async def test_messages_replies_carry_the_id_as_anthropic_sdks_read_it() -> None:
    async with running() as gw, gw.anthropic() as sdk:
        reply = await sdk.messages.with_raw_response.create(
            model="auto",
            max_tokens=32,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-request-id": "claude-run-1"},
        )
        message = await reply.parse()
        with pytest.raises(Exception) as missing:
            await sdk.messages.create(model="nope", max_tokens=32, messages=[{"role": "user", "content": "hi"}])
    assert message._request_id == "claude-run-1" == reply.headers["x-request-id"]
    assert NEW_ID.fullmatch(getattr(missing.value, "request_id", "") or "")


@pytest.mark.looptime
async def test_a_broken_stream_names_its_request_id_in_the_error_event() -> None:
    out = {"x-capmon-continue": "false"}  # opted out: a broken stream ends with the error event
    async with running() as gw, gw.http() as http:
        await gw.sim_admin("faults", {"mode": "stream_cut", "count": 1})
        cut = await http.post(
            "/v1/chat/completions", headers=out, json={"model": "auto", "messages": HELLO, "stream": True}
        )
        await gw.sim_admin("faults", {"mode": "stream_cut", "count": 1})
        failed = await http.post("/v1/responses", headers=out, json={"model": "auto", "input": "hi", "stream": True})
        await gw.sim_admin("faults", {"mode": "stream_cut", "count": 1})
        anth = await http.post(
            "/v1/messages",
            headers={"anthropic-version": "2023-06-01", **out},
            json={"model": "auto", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}], "stream": True},
        )
    chat_error = json.loads(sse_frames(cut.text)[-1]["data"])["error"]
    assert chat_error["request_id"] == cut.headers["x-request-id"]
    response_failed = json.loads(sse_frames(failed.text)[-1]["data"])
    assert response_failed["type"] == "response.failed"
    assert response_failed["response"]["error"]["request_id"] == failed.headers["x-request-id"]
    anth_error = json.loads(sse_frames(anth.text)[-1]["data"])
    assert anth_error["type"] == "error" and anth_error["request_id"] == anth.headers["request-id"]


def test_the_audit_keeps_the_request_id_and_an_older_database_gains_the_column() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE attempts (job TEXT, item TEXT, at REAL NOT NULL, attempt INTEGER NOT NULL, model TEXT,"
                 " endpoint TEXT, key_alias TEXT, status INTEGER, kind TEXT, hint REAL, wait REAL, latency REAL,"
                 " decision TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', api TEXT)")  # fmt: skip
    conn.execute("INSERT INTO attempts (job, at, attempt, decision) VALUES ('j', 1, 1, 'ok')")
    audit.ensure_schema(conn)
    request = Request(messages=(), job="j", item_id="i", request_id="req_abc")
    attempt = Attempt(1, "flagship", "t", "sim", "k", 2.0, 200, None, "", None, 0.0, 0.1, Decision.OK)
    audit.write_rows(conn, [audit.attempt_row(request, attempt)])
    rows = audit.read_attempts(conn, "j")
    assert [r.request_id for r in rows] == [None, "req_abc"]


@pytest.mark.looptime
async def test_a_request_for_a_tripped_model_served_by_another_says_it_fell_back() -> None:
    async with running() as gw, gw.openai() as sdk:
        gw.client.trip("flagship")
        raw = await sdk.chat.completions.with_raw_response.create(model="flagship", messages=HELLO)
        streamed = await sdk.chat.completions.with_raw_response.create(model="flagship", messages=HELLO, stream=True)
        async for _ in streamed.parse():
            pass
        auto = await sdk.chat.completions.with_raw_response.create(model="auto", messages=HELLO)
        gw.client.reset("flagship")
        asked = await sdk.chat.completions.with_raw_response.create(model="flagship", messages=HELLO)
        result = await gw.client.chat(Request.of(HELLO, model="medium"))
        fell = gw.client.bus.recent(types=[ev.FellBack])
    for reply in (raw, streamed, auto):
        h = reply.headers
        assert (h["x-capmon-model"], h["x-capmon-fallbacks"], h["x-capmon-attempts"]) == ("medium", "1", "1")
        assert h["x-litellm-attempted-fallbacks"] == "1"
    assert raw.headers["x-capmon-requested-model"] == "flagship" and auto.headers["x-capmon-requested-model"] == "auto"
    assert (asked.headers["x-capmon-model"], asked.headers["x-capmon-fallbacks"]) == ("flagship", "0")
    assert result.model == "medium" and result.fallbacks == 0 and result.requested == "medium"
    moves = [(e.from_model, e.to_model) for e in fell if isinstance(e, ev.FellBack)]
    assert moves == [("flagship", "medium")] * 3  # the metrics' capmon_fallbacks_total counts these


async def test_the_date_header_is_the_time_of_the_reply() -> None:
    # uvicorn refreshes its own Date every ten ticks: with the gateway's 1 s tick, up to 10 s old.
    async with running(scenario()) as gw, gw.http() as http:
        await asyncio.sleep(2.5)
        reply = await http.get("/health")
        now = default_clock().wall()
    dated = parsedate_to_datetime(reply.headers["date"]).timestamp()
    assert reply.headers.get_list("date") == [reply.headers["date"]]  # one Date, not uvicorn's as well
    assert now - 1.5 < dated <= now


async def test_an_internal_error_is_a_500_in_the_apis_shape_with_its_request_id_and_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import httpx

    from capmon.gateway.exchange import Exchanges

    lines: list[dict[str, object]] = []

    class Log:
        def write(self, line: dict[str, object]) -> None:
            lines.append(line)

    async def broken(scope: object, receive: object, send: object) -> None:
        raise RuntimeError("a bug")

    app = Exchanges(broken, clock=default_clock(), log=Log())  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        chat = await http.post("/v1/chat/completions", headers={"x-request-id": "mine-1"}, json={})
        messages = await http.post("/v1/messages", json={})
    assert chat.status_code == 500 and chat.headers["x-request-id"] == "mine-1"
    assert chat.json()["error"]["code"] == "internal_error" and "mine-1" in chat.json()["error"]["message"]
    assert messages.status_code == 500 and messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "api_error" and messages.headers["request-id"]
    assert [(line["status"], line["error_kind"]) for line in lines] == [(500, "internal"), (500, "internal")]
    assert "a bug" in caplog.text and "mine-1" in caplog.text


@pytest.mark.looptime
async def test_a_clients_id_holding_a_provider_key_is_replaced_everywhere_it_would_be_echoed(tmp_path: Path) -> None:
    # The provider key is a real key variable of the endpoint, which the simulator accepts; it has
    # no key's shape (as an Azure key has none), so only the registry of held keys knows it.
    key = "CANARY-provider-key-0123456789-Q777"
    where = tmp_path / "access.jsonl"
    keys = 'keys = [{ env = "GW_TEAM", alias = "team" }, { env = "GW_BATCH", alias = "nightly", priority = "batch" }]'
    team, batch = "team-key-0123456789abcdef", "batch-key-0123456789abcdef"
    async with (
        running(
            scenario(keys=(key,)),
            environ={"GW_PROVIDER_KEY": key, "GW_TEAM": team, "GW_BATCH": batch},
            gateway=f'{keys}\naccess_log = "{where}"',
        ) as gw,
        gw.openai(team) as sdk,
        gw.http(batch) as as_batch,
    ):
        auditor = audit.AuditLog(clock=gw.client.clock)
        gw.client.add_observer(auditor.observe)
        leaked = [f"trace-{key}", key, f"a{key}b"]
        replies = [
            await sdk.chat.completions.with_raw_response.create(
                model="auto", messages=HELLO, extra_headers={"x-request-id": rid}
            )
            for rid in leaked
        ]
        lines = []
        async with as_batch.stream("GET", "/capmon/events") as events:
            async for line in events.aiter_lines():
                lines.append(line)
                if sum(x.startswith("data:") and "RequestDone" in x for x in lines) >= len(leaked):
                    break
        rows = auditor.drain()
    log = where.read_text()
    stored = sqlite3.connect(":memory:")  # the audit as a job's database stores it
    audit.ensure_schema(stored)
    audit.write_rows(stored, rows)
    table = stored.execute("SELECT * FROM attempts").fetchall()
    ids = [r.headers["x-request-id"] for r in replies]
    assert all(NEW_ID.fullmatch(i) for i in ids) and len(set(ids)) == 3  # a fresh id for each, as for any bad id
    seen = {
        "the replies": json.dumps([dict(r.headers) for r in replies]) + "".join(r.text for r in replies),
        "the access log": log,
        "the events": "\n".join(lines),
        "the audit": repr(table),
    }
    for what, text in seen.items():
        assert "0123456789-Q777" not in text, f"the key reached {what}"
    assert {json.loads(x)["request_id"] for x in log.splitlines()} == set(ids)
    assert {r for (r,) in stored.execute("SELECT request_id FROM attempts")} == set(ids)  # the same fresh ids
    done = [json.loads(f["data"]) for f in sse_frames("\n".join(lines)) if f.get("event") == "RequestDone"]
    assert {d["caller_request_id"] for d in done} == set(ids)
