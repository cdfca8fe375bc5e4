"""AWS Bedrock's InvokeModel and InvokeModelWithResponseStream (``POST
/model/{modelId}/invoke``, ``/invoke-with-response-stream``) for Claude, with Anthropic's
Messages body and ``anthropic_version`` in it, as the anthropic SDK's AnthropicBedrock sends
them. Claude answers as on /v1/messages (capmon/sim/messages.py); Bedrock's front end checks
the credentials and the model as Converse's does (capmon/sim/bedrock.py) and words every
error in its shape. A stream's events go base64 in ``chunk`` events of AWS's event stream
(capmon/core/providers/aws_frames.py), and an ``error`` event as the exception it stands for
(overloaded_error: serviceUnavailableException, rate_limit_error: throttlingException, else
modelStreamErrorException).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterable, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from capmon.core.providers.aws_frames import MEDIA_TYPE, event
from capmon.sim import bedrock, dialects, messages
from capmon.sim.dialects import Wire
from capmon.sim.faults import DropConnection
from capmon.sim.replies import bearer, simulator, wire

# An Anthropic error event inside a stream -> the in-stream dialect whose exception says it.
_STREAM_ERRORS = {"overloaded_error": dialects.BEDROCK_STREAM_503, "rate_limit_error": dialects.BEDROCK_STREAM}


def _chunk(block: bytes) -> bytes | None:
    """One SSE event of Anthropic's stream as InvokeModelWithResponseStream carries it: its
    data, base64, in a ``chunk`` event; an ``error`` event as the exception it stands for."""
    fields = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line and not line.startswith(b":"))
    data = fields.get(b"data")
    if data is None:
        return None
    if fields.get(b"event") == b"error":
        kind = json.loads(data).get("error", {}).get("type")
        return dialects.bedrock_stream_error(_STREAM_ERRORS.get(kind, dialects.BEDROCK_STREAM_ERROR))
    return event("chunk", {"bytes": base64.b64encode(data).decode()})


async def chunked(sse: AsyncIterable[str | bytes | memoryview]) -> AsyncIterator[bytes]:
    """Anthropic's SSE stream re-framed as Bedrock's event stream."""
    buffer = b""
    async for piece in sse:
        buffer += piece.encode() if isinstance(piece, str) else bytes(piece)
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            frame = _chunk(block)
            if frame is not None:
                yield frame


async def invoke(request: Request) -> Response | DropConnection:
    return await serve_invoke(request, stream=False)


async def invoke_stream(request: Request) -> Response | DropConnection:
    return await serve_invoke(request, stream=True)


async def serve_invoke(request: Request, *, stream: bool) -> Response | DropConnection:
    """InvokeModel (``stream``: InvokeModelWithResponseStream) with Anthropic's Messages body
    and ``anthropic_version`` (bedrock-2023-05-31, or the SDK's own), as AnthropicBedrock sends
    it: Claude answers as on /v1/messages (capmon/sim/messages.py), Bedrock's front end checks
    the credentials and the model and words every error."""
    headers = {"x-amzn-RequestId": str(uuid.uuid4())}
    model = bedrock.model_id(request.path_params["model_id"])
    refused = await bedrock.signature_refused(request)
    if refused is not None:
        return refused
    sim = simulator(request)
    token = bearer(request, Wire.BEDROCK)
    alias = sim.authenticate(token)
    if alias is None:
        return wire(dialects.invalid_api_key(token, Wire.BEDROCK), headers)
    if bedrock.needs_profile(sim, model) or not sim.has_model(model, Wire.BEDROCK):
        sim.bad_request(alias, model)
        return bedrock.unknown_model(sim, model, headers)
    answer = await messages.serve_message(request, messages.MessagesVia(Wire.BEDROCK, model, stream))
    if isinstance(answer, StreamingResponse) and answer.media_type == "text/event-stream":
        answer.body_iterator = chunked(answer.body_iterator)
        answer.headers["content-type"] = MEDIA_TYPE
    return answer


def routes() -> list[Route]:
    return [
        Route("/model/{model_id:path}/invoke", invoke, methods=["POST"]),
        Route("/model/{model_id:path}/invoke-with-response-stream", invoke_stream, methods=["POST"]),
    ]
