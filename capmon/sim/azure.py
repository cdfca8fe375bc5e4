"""Azure OpenAI's URL shapes on the simulator's OpenAI handlers, for models whose scenario
``api`` is ``azure`` (or ``all``):

  POST /openai/deployments/{deployment}/chat/completions?api-version=...   (classic)
  POST /openai/deployments/{deployment}/responses?api-version=...
  POST /openai/v1/chat/completions, /openai/v1/responses                  (v1; api-version optional)

The key is Azure's ``api-key`` header (Bearer works too, as Entra tokens do there). On the
classic URLs the deployment names the model (the body's ``model`` is ignored, as Azure
ignores it) and a missing ``api-version`` is Azure's 400. Azure's own answers: 401 "Access
denied due to invalid subscription key...", 404 DeploymentNotFound, and a full model's
azure-429 naming the request's api-version; streams are framed the azure way (the prompt
filter chunk with empty choices first) unless the scenario says otherwise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capmon.sim import dialects
from capmon.sim.dialects import Wire
from capmon.sim.faults import DropConnection
from capmon.sim.replies import Via, wire

Handler = Callable[[Request, Via], Awaitable[Response | DropConnection]]
Endpoint = Callable[[Request], Awaitable[Response | DropConnection]]

API_VERSION = "api-version"


def _classic(serve: Handler) -> Endpoint:
    async def endpoint(request: Request) -> Response | DropConnection:
        version = request.query_params.get(API_VERSION)
        if not version:
            return wire(dialects.azure_error(400, "BadRequest", dialects.AZURE_MISSING_VERSION))
        return await serve(request, Via(Wire.AZURE, request.path_params["deployment"], version))

    return endpoint


def _v1(serve: Handler) -> Endpoint:
    async def endpoint(request: Request) -> Response | DropConnection:
        return await serve(request, Via(Wire.AZURE, None, request.query_params.get(API_VERSION)))

    return endpoint


def routes(chat: Handler, responses: Handler) -> list[Route]:
    """Azure's routes onto the chat completions and Responses handlers."""
    return [
        Route("/openai/deployments/{deployment}/chat/completions", _classic(chat), methods=["POST"]),
        Route("/openai/deployments/{deployment}/responses", _classic(responses), methods=["POST"]),
        Route("/openai/v1/chat/completions", _v1(chat), methods=["POST"]),
        Route("/openai/v1/responses", _v1(responses), methods=["POST"]),
    ]
