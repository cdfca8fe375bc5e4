"""Vertex AI's URLs, for models whose scenario ``api`` serves the vertex wire (vertex,
gemini+vertex, anthropic+vertex, all):

  POST /{v1,v1beta1}/projects/{project}/locations/{region}/publishers/google/models/{model}:generateContent
       (and :streamGenerateContent, ?alt=sse or not; :countTokens)   Gemini's API (gemini.py)
  POST /{v1,v1beta1}/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict
       (and :streamRawPredict; count-tokens:rawPredict)              Anthropic's Messages (messages.py)

Any project and region are taken (a model is served in all of them). The caller's OAuth
token is ``Authorization: Bearer`` (the simulator takes its scenario's keys as tokens; an
express-mode key in ``x-goog-api-key`` works too); a wrong one is Google's 401
UNAUTHENTICATED, a model not served here Google's 404 NOT_FOUND, whichever the publisher:
Google's front end answers those before a request reaches a model. Claude's own answers and
errors (its 400s, its 529 and in-stream overloaded_error) are Anthropic's, its body carries
``anthropic_version`` and no model (the URL names it), as AnthropicVertex sends it. A full
model says so in its dialect; the vertex wire's own is vertex-429, "Resource exhausted,
please try again later." (the shared pay-as-you-go pool).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capmon.sim import dialects, gemini, messages
from capmon.sim.dialects import Wire
from capmon.sim.faults import DropConnection
from capmon.sim.replies import bearer, simulator, wire

VERSIONS = ("v1", "v1beta1")
PREFIX = "/projects/{project}/locations/{region}/publishers/{publisher}/models/{call}"
RAW_PREDICT = ("rawPredict", "streamRawPredict")
COUNT_TOKENS_MODEL = "count-tokens"  # AnthropicVertex's count_tokens: .../models/count-tokens:rawPredict


async def call_model(request: Request) -> Response | DropConnection:
    model, method = gemini.split_call(request.path_params["call"])
    publisher = request.path_params["publisher"]
    if publisher == "google":
        return await gemini.serve(request, Wire.VERTEX, model, method)
    if publisher != "anthropic" or method not in RAW_PREDICT:
        return wire(dialects.status_error(404, Wire.VERTEX))
    sim = simulator(request)
    token = bearer(request, Wire.VERTEX)
    alias = sim.authenticate(token)
    if alias is None:
        return wire(dialects.invalid_api_key(token, Wire.VERTEX))
    if model == COUNT_TOKENS_MODEL:
        return await messages.count_tokens(request, messages.MessagesVia(Wire.VERTEX))
    if not sim.has_model(model, Wire.VERTEX):
        sim.bad_request(alias, model)
        return wire(dialects.model_not_found(model, Wire.VERTEX))
    return await messages.serve_message(request, messages.MessagesVia(Wire.VERTEX, model))


def routes() -> list[Route]:
    return [Route(f"/{version}{PREFIX}", call_model, methods=["POST"]) for version in VERSIONS]
