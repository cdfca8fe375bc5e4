"""The ASGI app in-process (httpx ASGITransport): the OpenAI API, every dialect's
rejection, admin endpoints, counters and faults. Tests that wait on service times run
on a fast-forwarded loop (looptime), so simulated seconds cost no real time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.app import SIM_HEADER, create_app, simulator_of
from capmon.sim.dialects import BEDROCK_CAPACITY, CAPACITY_MESSAGE, DIALECTS
from capmon.sim.faults import ConnectionDropped
from capmon.sim.model import key_alias
from capmon.sim.scenario import ModelSpec, PenaltySpec, Phase, Scenario

AUTH = {"Authorization": f"Bearer {SIMULATOR_DEMO_KEY}"}


def scenario(
    *,
    slots: int = 2,
    dialect: str = "openai-503",
    hint: float | None = None,
    schedule: tuple[Phase, ...] = (),
    penalty: PenaltySpec = PenaltySpec(),
) -> Scenario:
    return Scenario(
        name="test",
        models=(
            ModelSpec(
                name="sim-test",
                slots=slots,
                base_latency=2.0,
                per_token=0.05,
                noise=0.0,
                answer_tokens=20,
                context_window=1000,
                dialect=dialect,
                hint=hint,
                schedule=schedule,
            ),
            ModelSpec(name="sim-other", slots=10, base_latency=0.5, per_token=0.0, noise=0.0, answer_tokens=8),
        ),
        keys=(SIMULATOR_DEMO_KEY, "sk-second"),
        penalty=penalty,
    )


def make_app(scn: Scenario | None = None) -> Starlette:
    app = create_app(scn or scenario())
    simulator_of(app).start()
    return app


def client_for(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim")


@pytest.fixture
async def app() -> Starlette:
    return make_app()


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(app) as c:
        yield c


def chat(model: str = "sim-test", content: str = "Hello there", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


async def post_chat(
    client: httpx.AsyncClient, body: Any = None, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions",
        json=body if body is not None else chat(**extra),
        headers=AUTH if headers is None else headers,
    )


def sse_events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]


# ---------------------------------------------------------------- the OpenAI API


@pytest.mark.looptime
async def test_plain_completion(client: httpx.AsyncClient) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r = await post_chat(client, max_tokens=10)
    took = loop.time() - t0
    assert r.status_code == 200
    assert r.headers[SIM_HEADER] == "test" and r.headers["x-request-id"].startswith("req_")
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "sim-test"
    assert body["id"].startswith("chatcmpl-") and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 10
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17}  # 3 + one message
    assert took == pytest.approx(2.0 + 0.05 * 10)  # base latency + per token, on the loop's clock


@pytest.mark.looptime
async def test_streaming_completion(client: httpx.AsyncClient) -> None:
    r = await post_chat(client, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(text.split()) == 20
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finals[-1] == "stop" and set(finals[:-1]) == {None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20
    stats = (await client.get("/admin/stats")).json()
    assert stats["totals"]["completed"] == 1 and stats["totals"]["in_flight"] == 0


async def test_models_list(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models", headers=AUTH)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["sim-test", "sim-other"]
    assert (await client.get("/v1/models/sim-test", headers=AUTH)).json()["id"] == "sim-test"
    assert (await client.get("/v1/models/nope", headers=AUTH)).status_code == 404
    assert (await client.get("/v1/models")).status_code == 401


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-wrong-key-123"}, {"Authorization": "Basic x"}])
async def test_bad_key_is_401(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    r = await post_chat(client, headers=headers)
    assert r.status_code == 401
    error = r.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert "sk-wrong-key-123" not in r.text


async def test_other_key_headers_are_accepted(client: httpx.AsyncClient, app: Starlette) -> None:
    simulator_of(app).configure("sim-test", slots=0)  # answers at once
    r = await post_chat(client, headers={"api-key": "sk-second"})
    assert r.status_code == 503


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    r = await post_chat(client, model="gpt-nope")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"


async def test_invalid_json_is_400(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", content=b"{not json", headers=AUTH)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body, param",
    [
        ([1, 2], None),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "sim-test", "messages": []}, "messages"),
        ({"model": "sim-test", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"model": "sim-test", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ],
)
async def test_malformed_requests_are_400(client: httpx.AsyncClient, body: Any, param: str | None) -> None:
    r = await post_chat(client, body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


async def test_context_length_exceeded(client: httpx.AsyncClient) -> None:
    r = await post_chat(client, content="x" * 3600, max_tokens=101)  # 900 + 101 > 1000
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 1000 tokens" in error["message"]
    stats = (await client.get("/admin/stats")).json()
    assert stats["models"]["sim-test"]["rejected"]["bad_request"] == 1


# ---------------------------------------------------------------- capacity


@pytest.mark.looptime
async def test_full_model_rejects_at_once_in_its_dialect(client: httpx.AsyncClient) -> None:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    done: list[float] = []

    async def one() -> httpx.Response:
        r = await post_chat(client)
        done.append(loop.time() - t0)
        return r

    rs = await asyncio.gather(*(one() for _ in range(5)))
    codes = sorted(r.status_code for r in rs)
    assert codes == [200, 200, 503, 503, 503]
    # The three rejections came back at once; the two accepted took the service time.
    assert sorted(done)[:3] == [0, 0, 0]
    assert sorted(done)[3:] == [pytest.approx(3.0), pytest.approx(3.0)]
    # Once they finish, there is room again.
    assert (await post_chat(client)).status_code == 200
    stats = (await client.get("/admin/stats")).json()
    assert stats["totals"]["rejected"]["capacity"] == 3
    assert stats["models"]["sim-test"]["completed"] == 3


@pytest.mark.looptime
async def test_disconnected_stream_frees_its_slot(app: Starlette) -> None:
    sim = simulator_of(app)
    async with client_for(app) as c:
        task = asyncio.create_task(post_chat(c, stream=True))
        await asyncio.sleep(2.5)  # mid-stream
        assert sim.state("sim-test").in_flight == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert sim.state("sim-test").in_flight == 0
    assert sim.stats()["totals"]["cancelled"] == 1


@pytest.mark.looptime
async def test_schedule_outage_in_the_app() -> None:
    app = make_app(scenario(slots=4, schedule=(Phase(at=10, slots=0, dialect="capacity-text"), Phase(at=40))))
    async with client_for(app) as c:
        assert (await post_chat(c)).status_code == 200
        await asyncio.sleep(10)
        r = await post_chat(c)
        assert (r.status_code, r.text) == (503, CAPACITY_MESSAGE)
        await asyncio.sleep(30)
        assert (await post_chat(c)).status_code == 200


def _expect(dialect: str, r: httpx.Response, hint: float | None) -> None:
    h = r.headers
    if dialect == "openai-429":
        assert r.status_code == 429
        error = r.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert h["x-ratelimit-limit-requests"] == "0" and h["x-ratelimit-remaining-requests"] == "0"
        if hint is None:
            assert "x-ratelimit-reset-requests" not in h and "try again" not in error["message"]
        else:
            assert h["x-ratelimit-reset-requests"] == "1.5s" and h["retry-after"] == "2"
            assert "Please try again in 1.5s." in error["message"]
    elif dialect == "openai-503":
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "server_is_overloaded" and error["message"].startswith(
            "The engine is currently overloaded"
        )
    elif dialect == "anthropic-529":
        assert r.status_code == 529
        assert r.json() == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    elif dialect == "anthropic-429":
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert h["anthropic-ratelimit-requests-remaining"] == "0"
        assert h.get("retry-after") == (None if hint is None else "2")
    elif dialect == "gemini-429":
        assert r.status_code == 429
        error = r.json()["error"]
        assert (error["code"], error["status"]) == (429, "RESOURCE_EXHAUSTED")
        retry = [d for d in error["details"] if d["@type"].endswith("RetryInfo")]
        assert retry == (
            [] if hint is None else [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.500s"}]
        )
    elif dialect == "gemini-503":
        assert r.status_code == 503
        error = r.json()["error"]
        assert (error["code"], error["status"], error["message"]) == (
            503,
            "UNAVAILABLE",
            "The model is overloaded. Please try again later.",
        )
        assert ("details" in error) == (hint is not None)
    elif dialect == "vertex-429":  # the shared pay-as-you-go pool: no details, no hint
        assert r.status_code == 429
        assert r.json() == {
            "error": {
                "code": 429,
                "message": "Resource exhausted, please try again later.",
                "status": "RESOURCE_EXHAUSTED",
            }
        }
    elif dialect == "vertex-quota-429":  # the project's quota, in Vertex's list
        assert r.status_code == 429
        (item,) = r.json()
        error = item["error"]
        assert (error["code"], error["status"]) == (429, "RESOURCE_EXHAUSTED")
        assert "online_prediction_requests_per_base_model" in error["message"] and "sim-test" in error["message"]
        assert ("details" in error) == (hint is not None)
    elif dialect == "azure-429":
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "429"
        if hint is not None:
            assert h["retry-after-ms"] == "1500" and h["retry-after"] == "2"
    elif dialect == "capacity-text":
        assert r.status_code == 503
        assert r.text == "Selected model is at capacity. Please try a different model."
    elif dialect.startswith("bedrock-"):  # Bedrock's exception in x-amzn-ErrorType; it sends no hint
        status, exception, message = BEDROCK_CAPACITY[dialect]
        assert (r.status_code, r.json()) == (status, {"message": message})
        assert h["x-amzn-errortype"] == f"{exception}:http://internal.amazon.com/coral/com.amazon.bedrock/"
    else:  # pragma: no cover
        raise AssertionError(dialect)
    if hint is None:
        assert not {"retry-after", "retry-after-ms"} & set(h)
    elif not dialect.startswith(("gemini-", "vertex-", "bedrock-")):
        assert h["retry-after"] == "2"


@pytest.mark.parametrize("hint", [None, 1.5])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_each_dialect(dialect: str, hint: float | None) -> None:
    app = make_app(scenario(slots=0, dialect=dialect, hint=hint))
    async with client_for(app) as c:
        _expect(dialect, await post_chat(c), hint)


async def test_admin_model_changes(client: httpx.AsyncClient) -> None:
    r = await client.post("/admin/models/sim-test", json={"slots": 0, "dialect": "anthropic-529", "hint": 3})
    assert r.status_code == 200
    state = r.json()
    assert (state["slots"], state["dialect"], state["hint"]) == (0, "anthropic-529", 3.0)
    r = await post_chat(client)
    assert (r.status_code, r.headers["retry-after"]) == (529, "3")
    assert (await client.get("/admin/models/sim-test")).json()["overrides"] == ["dialect", "hint", "slots"]
    r = await client.post("/admin/models/sim-test", json={"reset_schedule": True})
    assert (r.json()["slots"], r.json()["overrides"]) == (2, [])
    assert (await client.post("/admin/models/nope", json={"slots": 1})).status_code == 404
    for bad in ({"slots": -1}, {"latency_factor": 0}, {"dialect": "x"}, {"slot": 1}, [1]):
        r = await client.post("/admin/models/sim-test", json=bad)
        assert r.status_code == 400, bad
        assert r.json()["error"]["message"]


@pytest.mark.looptime
async def test_admin_latency_factor(client: httpx.AsyncClient) -> None:
    await client.post("/admin/models/sim-test", json={"latency_factor": 3})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert (await post_chat(client)).status_code == 200
    assert loop.time() - t0 == pytest.approx(3 * 3.0)


@pytest.mark.looptime
async def test_admin_outage(client: httpx.AsyncClient) -> None:
    r = await client.post("/admin/outage/sim-test", json={"duration": 30, "dialect": "capacity-text"})
    assert r.status_code == 200 and r.json()["slots"] == 0
    assert (await post_chat(client)).text == CAPACITY_MESSAGE
    await asyncio.sleep(31)
    assert (await post_chat(client)).status_code == 200
    assert (await client.post("/admin/outage/sim-test", json={"duration": "long"})).status_code == 400


@pytest.mark.looptime
async def test_stats_and_reset(client: httpx.AsyncClient) -> None:
    await post_chat(client)
    await post_chat(client, headers={"Authorization": "Bearer sk-wrong"})
    await post_chat(client, model="nope")
    stats = (await client.get("/admin/stats")).json()
    assert SIMULATOR_DEMO_KEY not in json.dumps(stats)
    totals = stats["totals"]
    assert (totals["requests"], totals["accepted"], totals["completed"]) == (3, 1, 1)
    assert totals["rejected"] == {"capacity": 0, "rate_limited": 0, "auth": 1, "bad_request": 1}
    assert stats["keys"][key_alias(SIMULATOR_DEMO_KEY)]["requests"] == 2
    assert stats["models"]["sim-test"]["slots"] == 2
    reset = (await client.post("/admin/reset")).json()
    assert reset["totals"]["requests"] == 0


async def test_penalty_over_http() -> None:
    app = make_app(scenario(slots=0, penalty=PenaltySpec(enabled=True, threshold=3, window=10, duration=30)))
    async with client_for(app) as c:
        codes = [(await post_chat(c)).status_code for _ in range(4)]
        assert codes == [503] * 4
        r = await post_chat(c)
        assert r.status_code == 429
        assert r.json()["error"]["message"] == "penalised: too many requests after rejections"
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.headers["retry-after"] == "30"
        assert (await post_chat(c, model="sim-other")).status_code == 429  # the whole key
        stats = (await c.get("/admin/stats")).json()
        assert stats["totals"]["penalised"] == 2
        assert stats["keys"][key_alias(SIMULATOR_DEMO_KEY)]["penalised_for"] == pytest.approx(30, abs=1)


# ---------------------------------------------------------------- faults


async def set_fault(client: httpx.AsyncClient, **rule: Any) -> None:
    r = await client.post("/admin/faults", json=rule)
    assert r.status_code == 200, r.text


@pytest.mark.looptime
async def test_fault_reset_drops_the_connection(client: httpx.AsyncClient) -> None:
    await set_fault(client, mode="reset", count=1)
    with pytest.raises(ConnectionDropped):  # through a real server: a dropped connection
        await post_chat(client)
    assert (await post_chat(client)).status_code == 200


@pytest.mark.looptime
@pytest.mark.parametrize(
    "mode, status, check",
    [
        ("truncate", 200, lambda r: r.text.startswith('{"id": "chatcmpl-') and not r.text.endswith("}")),
        ("invalid_json", 200, lambda r: r.text == "not json"),
        ("html_500", 500, lambda r: r.headers["content-type"].startswith("text/html") and "<h1>" in r.text),
    ],
)
async def test_broken_bodies(client: httpx.AsyncClient, mode: str, status: int, check: Any) -> None:
    await set_fault(client, mode=mode, count=2)
    for _ in range(2):
        r = await post_chat(client)
        assert r.status_code == status and check(r)
        if r.status_code == 200:
            with pytest.raises(ValueError):
                r.json()
    assert (await post_chat(client)).json()["object"] == "chat.completion"
    stats = (await client.get("/admin/stats")).json()
    assert stats["totals"]["faults"] == 2 and stats["faults"] == []


@pytest.mark.looptime
async def test_fault_hang(client: httpx.AsyncClient) -> None:
    await set_fault(client, mode="hang", count=1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(post_chat(client), timeout=600)
    assert loop.time() - t0 == pytest.approx(600)
    assert (await post_chat(client)).status_code == 200


@pytest.mark.looptime
async def test_fault_stream_cut(client: httpx.AsyncClient) -> None:
    await set_fault(client, mode="stream_cut", count=1)
    assert (await post_chat(client)).status_code == 200  # a plain request passes by
    r = await post_chat(client, stream=True)
    events = sse_events(r.text)
    assert r.status_code == 200 and "[DONE]" not in events
    words = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events).split()
    assert 0 < len(words) < 20
    assert sse_events((await post_chat(client, stream=True)).text)[-1] == "[DONE]"


async def test_fault_admin(client: httpx.AsyncClient) -> None:
    r = await client.post("/admin/faults", json={"mode": "html_500", "rate": 0.5, "model": "sim-other"})
    assert r.json()["faults"] == [{"mode": "html_500", "count": None, "rate": 0.5, "model": "sim-other"}]
    assert (await client.get("/admin/faults")).json()["faults"][0]["mode"] == "html_500"
    assert (await client.delete("/admin/faults")).json()["faults"] == []
    assert (await client.post("/admin/faults", json={"mode": "boom"})).status_code == 400
    assert (await client.post("/admin/faults", content=b"{")).status_code == 400
