"""The simulator's admin API (``/admin``) and who may use it.

On loopback the admin API needs no key unless one is configured. A simulator that listens
anywhere else must have an admin key (checked in constant time, sent as ``Authorization:
Bearer KEY`` or ``x-admin-key: KEY``) or be told explicitly that admin is open to anyone
who can reach it. :func:`admin_policy` decides; :class:`AdminGuard` enforces.
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from capmon.core.base.exceptions import SimulatorError
from capmon.core.types.config import is_loopback
from capmon.sim.faults import parse_rules
from capmon.sim.model import UNSET, Simulator
from capmon.sim.replies import BadRequest, simulator

ADMIN_KEY_ENV = "CAPMON_SIM_ADMIN_KEY"
ADMIN_KEY_HEADER = "x-admin-key"
MODEL_FIELDS = (
    "slots",
    "latency_factor",
    "hint",
    "dialect",
    "reset_schedule",
    "stream_style",
    "tools",
    "token_param",
    "unsupported_dialect",
    "usage",
)


class AdminAccess(str, enum.Enum):
    LOOPBACK = "loopback"  # no key: only this machine can reach the server
    KEY = "key"  # the admin key is required
    OPEN = "open"  # no key, and the server is reachable from elsewhere (asked for explicitly)


@dataclass(frozen=True)
class AdminPolicy:
    access: AdminAccess = AdminAccess.LOOPBACK
    key: str | None = dataclasses.field(default=None, repr=False)  # never shown

    def describe(self) -> str:
        if self.access is AdminAccess.KEY:
            return f"admin under /admin requires the admin key (Authorization: Bearer KEY or {ADMIN_KEY_HEADER}: KEY)"
        if self.access is AdminAccess.OPEN:
            return "admin under /admin is OPEN to anyone who can reach this address (--open-admin)"
        return "admin under /admin needs no key: this server listens on loopback only"


def admin_policy(
    host: str, key: str | None, *, open_admin: bool = False, key_source: str = ADMIN_KEY_ENV
) -> AdminPolicy:
    """How /admin is protected when serving on ``host``. Raises SimulatorError when a
    non-loopback address has neither a key nor ``open_admin``."""
    if key:
        return AdminPolicy(AdminAccess.KEY, key)
    if is_loopback(host):
        return AdminPolicy(AdminAccess.LOOPBACK)
    if open_admin:
        return AdminPolicy(AdminAccess.OPEN)
    raise SimulatorError(
        f"listening on {host} (not loopback) needs an admin key for /admin: set {key_source} "
        f"(or name another variable with --admin-key-env), or pass --open-admin to serve it to anyone"
    )


def _presented(scope: Scope) -> str | None:
    headers: dict[str, str] = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    key: str | None = headers.get(ADMIN_KEY_HEADER) or None
    return key


class AdminGuard:
    """Pure ASGI: answers 401 for /admin without the right key when the policy has one."""

    def __init__(self, app: ASGIApp, policy: AdminPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = self.policy.key
        path = scope.get("path", "")
        if scope["type"] == "http" and key and (path == "/admin" or path.startswith("/admin/")):
            given = _presented(scope)
            if given is None or not hmac.compare_digest(given.encode(), key.encode()):
                reply = JSONResponse(
                    {
                        "error": {
                            "message": f"admin requires the admin key: Authorization: Bearer "
                            f"KEY or {ADMIN_KEY_HEADER}: KEY"
                        }
                    },
                    status_code=401,
                    headers={"www-authenticate": "Bearer"},
                )
                await reply(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ---------------------------------------------------------------- endpoints


def _admin_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


async def _admin_body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest("the body must be JSON") from None


def state_json(sim: Simulator, name: str) -> dict[str, Any]:
    state = sim.state(name)
    return {**dataclasses.asdict(state), "free": state.free, "overrides": list(state.overrides)}


async def admin_stats(request: Request) -> Response:
    return JSONResponse(simulator(request).stats())


async def admin_reset(request: Request) -> Response:
    sim = simulator(request)
    sim.reset_counters()
    return JSONResponse(sim.stats())


async def admin_model(request: Request) -> Response:
    sim = simulator(request)
    name = request.path_params["name"]
    if not sim.has_model(name):
        return _admin_error(404, f"no model named {name!r}; known: {', '.join(sim.model_names())}")
    if request.method == "GET":
        return JSONResponse(state_json(sim, name))
    try:
        body = await _admin_body(request)
        if not isinstance(body, dict):
            raise BadRequest("expected a JSON object")
        unknown = set(body) - set(MODEL_FIELDS)
        if unknown:
            raise BadRequest(
                f"unknown field(s) {', '.join(sorted(unknown))}; expected {', '.join(sorted(MODEL_FIELDS))}"
            )
        values = {f: body.get(f, UNSET) for f in MODEL_FIELDS if f != "reset_schedule"}
        sim.configure(name, reset_schedule=bool(body.get("reset_schedule", False)), **values)
    except (BadRequest, ValueError) as e:
        return _admin_error(400, str(e))
    return JSONResponse(state_json(sim, name))


async def admin_outage(request: Request) -> Response:
    sim = simulator(request)
    name = request.path_params["name"]
    if not sim.has_model(name):
        return _admin_error(404, f"no model named {name!r}; known: {', '.join(sim.model_names())}")
    try:
        body = await _admin_body(request)
        if not isinstance(body, dict):
            raise BadRequest("expected a JSON object")
        sim.outage(name, body.get("duration", 30.0), body.get("dialect"))
    except (BadRequest, ValueError) as e:
        return _admin_error(400, str(e))
    return JSONResponse(state_json(sim, name))


async def admin_faults(request: Request) -> Response:
    sim = simulator(request)
    if request.method == "DELETE":
        sim.faults.clear()
    elif request.method == "POST":
        try:
            sim.faults.set(parse_rules(await _admin_body(request)))
        except (BadRequest, ValueError) as e:
            return _admin_error(400, str(e))
    return JSONResponse({"faults": sim.faults.snapshot()})


ROUTES = [
    Route("/admin/stats", admin_stats),
    Route("/admin/reset", admin_reset, methods=["POST"]),
    Route("/admin/models/{name:path}", admin_model, methods=["GET", "POST"]),
    Route("/admin/outage/{name:path}", admin_outage, methods=["POST"]),
    Route("/admin/faults", admin_faults, methods=["GET", "POST", "DELETE"]),
]
