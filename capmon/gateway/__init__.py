"""``capmon serve``: an OpenAI-compatible HTTP gateway in front of one shared
FallbackClient, with Prometheus metrics, health checks and a control API a dashboard
attaches to. The core never imports this package.

| module | its one job |
|---|---|
| ``serve.py`` | the command: config, engine, server, signals, exit codes |
| ``server.py`` | uvicorn in the running loop on a socket bound here |
| ``app.py`` | the ASGI app: routes, OpenAI-shaped 404 / 405, /metrics, /health, /ready |
| ``settings.py`` | ``[gateway]`` checked against the models; client and admin keys from the environment |
| ``auth.py`` | who is calling, compared in constant time; what each route needs |
| ``openai_api.py`` | /v1/chat/completions, /v1/responses, /v1/models |
| ``shape.py``, ``sliced.py`` | a body counted against the limits of shape before it expands; big ones read in slices |
| ``bodies.py`` | a request body and the per-request headers -> a Request |
| ``fields.py`` | one strict parser per field read from outside: JSON bodies, headers, the event number |
| ``models.py`` | model names, aliases and alias patterns a client may send |
| ``replies.py`` | plain and streamed answers, run while watching the connection |
| ``disconnect.py`` | cancel a request's work when its client goes away |
| ``sse.py`` | the two APIs' SSE framing, and how a broken stream ends |
| ``errors.py`` | OpenAI error shapes; what a failed request becomes |
| ``headers.py`` | x-capmon-* and x-litellm-* response headers |
| ``metrics.py`` | the Prometheus registry |
| ``feed.py``, ``control.py`` | numbered events for SSE readers; the /capmon/ control API |
| ``readiness.py`` | /ready, and a 429's Retry-After |
| ``exchange.py``, ``access_log.py`` | one request as the operator sees it: its id, its access log line |
| ``gateway_log.py`` | the process's own log (every logger's) on stderr, never waited on by a request |
| ``telemetry.py``, ``traces.py`` | ``[telemetry]``: the OpenTelemetry spans of each request and its attempts |
| ``trace_relay.py``, ``relay_process.py`` | the spans sent by a relay process, off the event loop's GIL |
"""

from capmon.gateway.app import close_app, create_app
from capmon.gateway.serve import ServeOptions, serve
from capmon.gateway.server import GatewayError, GatewayServer, start_server
from capmon.gateway.settings import GatewaySettings, load_settings

__all__ = [
    "GatewayError",
    "GatewayServer",
    "GatewaySettings",
    "ServeOptions",
    "close_app",
    "create_app",
    "load_settings",
    "serve",
    "start_server",
]
