"""The control API under /capmon/, what a dashboard attaches to (``capmon --connect``):

  GET  /capmon/info         what this is: version, models, aliases, targets, and whether
                            the caller may act (``readonly``)
  GET  /capmon/snapshot     the client's snapshot (capmon.core.types.serial.snapshot_to_json)
  GET  /capmon/events       SSE: ``id: N`` / ``event: TYPE`` / ``data: event_to_json``, the
                            recent history first; ``Last-Event-ID`` or ``?since=N`` resumes
  POST /capmon/pin          {"model": NAME | null}  a model, or one of its deployments (model@endpoint)
  POST /capmon/trip         {"target": NAME}   a model (all its targets), a deployment (model@endpoint:
                                               its targets there) or a target id
  POST /capmon/reset        {"target": NAME}
  POST /capmon/force-close  {"target": NAME}

Actions need the admin key (403 without it) and answer with what they changed, not the
whole snapshot: ``{"ok": true, "targets": [{"target", "model", "endpoint", "state",
"manual", "reason"}, ...]}`` for trip, reset and force-close (each target of the model or
deployment named, or the one target), ``{"ok": true, "pinned": NAME | null}`` for pin.
Reads need a client key or the admin key when the gateway has client keys. Every
reason and message in them is redacted; only the admin sees the first characters of a
masked key (``sk-pro****``), anyone else no part of a provider key, only its alias.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from capmon import __version__
from capmon.core.base.exceptions import CapmonError
from capmon.core.base.secrets import redact
from capmon.core.types.serial import Audience, event_to_json, snapshot_to_json
from capmon.gateway import fields, sse
from capmon.gateway.auth import Access, Caller
from capmon.gateway.context import Gateway, gateway_of
from capmon.gateway.disconnect import ClientGone, until_disconnect
from capmon.gateway.errors import ApiError, json_bytes
from capmon.gateway.feed import EventFeed
from capmon.gateway.inbound import read_text
from capmon.gateway.replies import JsonReply, Nothing

API_VERSION = 1
KEEPALIVE = 15.0  # seconds between comments on an idle event stream (proxies close silent ones)


async def info(request: Request) -> Response:
    gw = gateway_of(request)
    caller = gw.auth.require(request.headers, Access.USE)
    c = gw.client
    return JsonReply(
        {
            "service": "capmon-gateway",
            "version": __version__,
            "api_version": API_VERSION,
            "simulator": c.config.simulator.scenario if c.config.simulator.enabled else None,
            "models": c.model_names(),
            "aliases": {k: v for k, v in gw.names.aliases.items()},
            "targets": [
                {
                    "target": t.id,
                    "model": t.model.name,
                    "endpoint": t.endpoint.name,
                    "deployment": t.deployment,
                    "key_alias": t.key.alias,
                }
                for t in c.targets
            ],
            "readonly": not caller.admin,
            "admin_key_configured": gw.settings.admin is not None,
            "client_keys": len(gw.settings.keys),
            "caller": caller.role.value,
            "deadline": c.config.client.deadline,
            "batch_share": c.config.client.batch_share,
            "events": gw.feed.last,
        }
    )


def _audience(caller: Caller) -> Audience:
    return Audience.OPERATOR if caller.admin else Audience.CLIENT


async def snapshot(request: Request) -> Response:
    gw = gateway_of(request)
    caller = gw.auth.require(request.headers, Access.USE)
    return JsonReply(snapshot_to_json(gw.client.snapshot(), _audience(caller)))


def _since(request: Request) -> int | None:
    header = request.headers.get("last-event-id")
    if header:  # an empty Last-Event-ID means none (the SSE standard)
        return fields.event_number(header, "last-event-id")
    return fields.event_number(request.query_params.get("since"), "since")


class EventStream(Response):
    def __init__(self, gw: Gateway, since: int | None, audience: Audience) -> None:
        super().__init__()
        self.gw = gw
        self.feed: EventFeed = gw.feed
        self.since = since
        self.audience = audience

    async def _pump(self, send: Send) -> None:
        reader = self.feed.reader(self.since)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(k.encode(), v.encode()) for k, v in sse.HEADERS.items()],
                }
            )
            await send({"type": "http.response.body", "body": b"retry: 2000\n\n", "more_body": True})
            while not reader.closed:
                items, dropped = await reader.take(KEEPALIVE)
                out = [sse.comment(f"{dropped} events dropped: this reader lagged")] if dropped else []
                for seq, e in items:
                    data = event_to_json(e, self.audience)
                    out.append(f"id: {seq}\nevent: {data['type']}\ndata: ".encode() + json_bytes(data) + b"\n\n")
                await send(
                    {"type": "http.response.body", "body": b"".join(out) or sse.comment("keepalive"), "more_body": True}
                )
            await send(
                {"type": "http.response.body", "body": sse.comment("the gateway is stopping"), "more_body": False}
            )
        finally:
            self.feed.drop(reader)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(scope, receive, self._pump(send))
        except ClientGone:
            pass


async def events(request: Request) -> Response:
    gw = gateway_of(request)
    caller = gw.auth.require(request.headers, Access.USE)
    return EventStream(gw, _since(request), _audience(caller))


async def _body(request: Request, allowed: tuple[str, ...]) -> dict[str, Any] | None:
    text = await read_text(request.receive, request.headers, 65536)
    if text is None:
        return None
    body = fields.json_object(text, empty={})
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ApiError(
            400,
            f"unknown field(s) {', '.join(map(repr, unknown))}; expected {', '.join(allowed)}",
            param=unknown[0][:60],
        )
    fields.string(body, "reason")
    return body


def _states(gw: Gateway, name: str) -> Response:
    """The new state of each target an action on ``name`` (a model, a deployment or a target
    id) moved."""
    rows = [t for t in gw.client.snapshot().targets if name == t.target or t.pinned_by(name)]
    targets = [
        {
            "target": t.target,
            "model": t.model,
            "endpoint": t.endpoint,
            "state": t.state.value,
            "manual": t.manual,
            "reason": redact(t.breaker_reason),
        }
        for t in rows
    ]
    return JsonReply({"ok": True, "targets": targets})


def _not_found(e: CapmonError) -> ApiError:
    return ApiError(404, str(e), "invalid_request_error", "not_found")


async def pin(request: Request) -> Response:
    gw = gateway_of(request)
    gw.auth.require(request.headers, Access.ADMIN)
    body = await _body(request, ("model",))
    if body is None:
        return Nothing()
    if "model" not in body:
        raise ApiError(
            400, 'expected {"model": NAME} to pin a model or {"model": null} to go back to automatic', param="model"
        )
    model = fields.string(body, "model")
    try:
        gw.client.pin(model)
    except CapmonError as e:
        raise _not_found(e) from None
    return JsonReply({"ok": True, "pinned": gw.client.pinned})


def _action(act: Callable[[Gateway, str, str], None], what: str) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        gw = gateway_of(request)
        gw.auth.require(request.headers, Access.ADMIN)
        body = await _body(request, ("target", "reason"))
        if body is None:
            return Nothing()
        target = body.get("target")
        if not isinstance(target, str) or not target:
            raise ApiError(400, 'expected {"target": NAME}: a model or a target id', param="target")
        try:
            # Redacted before it is kept: a person may paste a key into a reason.
            act(gw, target, redact(body.get("reason") or f"{what} by hand through the gateway"))
        except CapmonError as e:
            raise _not_found(e) from None
        return _states(gw, target)

    return endpoint


ROUTES = [
    Route("/capmon/info", info, methods=["GET"]),
    Route("/capmon/snapshot", snapshot, methods=["GET"]),
    Route("/capmon/events", events, methods=["GET"]),
    Route("/capmon/pin", pin, methods=["POST"]),
    Route("/capmon/trip", _action(lambda gw, t, r: gw.client.trip(t, r), "tripped"), methods=["POST"]),
    Route("/capmon/reset", _action(lambda gw, t, r: gw.client.reset(t, r), "reset"), methods=["POST"]),
    Route("/capmon/force-close", _action(lambda gw, t, r: gw.client.force_close(t, r), "closed"), methods=["POST"]),
]
