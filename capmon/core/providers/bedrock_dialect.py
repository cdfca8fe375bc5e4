"""The AWS Bedrock dialect (``api = "bedrock"``, its endpoint key ``region``): the Bedrock
runtime of one region, ``{base_url}/model/{modelId}/converse`` and, streamed,
``/converse-stream``, which speak Converse (converse_format.py) whatever the caller's
format and whatever the model's family. ``base_url`` defaults to
``https://bedrock-runtime.{region}.amazonaws.com``.

The model id goes into the path percent-encoded as boto3 encodes it (``:`` as ``%3A``,
``/`` as ``%2F``), so an inference profile's id (``us.anthropic.claude-sonnet-4-5-20250929-v1:0``,
``global.…``) or any ARN (a profile's, a provisioned model's) is a deployment's model id as
well as a base model's.

The key: a Bedrock API key in ``keys`` (such as ``AWS_BEARER_TOKEN_BEDROCK``) is sent as a
fixed ``Authorization: Bearer``; an endpoint without keys signs each request with SigV4
(service ``bedrock``, the endpoint's region) from the standard AWS credential chain
(aws_sigv4.py). The stream is AWS's binary event stream (aws_eventstream.py). Both need
botocore (the ``aws`` extra), asked for when a target is made. A module of
:class:`capmon.core.providers.dialect.Dialect`.
"""

from __future__ import annotations

import urllib.parse

from capmon.core.providers import aws_eventstream, aws_sigv4, openai_dialect
from capmon.core.providers.aws_eventstream import EventStreamFraming
from capmon.core.providers.dialect import Auth
from capmon.core.types.config import EndpointConfig, ModelConfig
from capmon.core.types.result import Format

GENAI_PROVIDER = "aws.bedrock"  # gen_ai.provider.name (OpenTelemetry's GenAI conventions)


def wire_of(caller: Format, model: str) -> Format:
    return Format.CONVERSE


def model_url(endpoint: EndpointConfig, model: ModelConfig) -> str:
    """The model's resource: its id (a base model's, an inference profile's, an ARN) as one
    path segment, every character but ``-._~`` escaped (botocore's ``percent_encode``)."""
    return endpoint.base_url.rstrip("/") + "/model/" + urllib.parse.quote(model.wire_name, safe="-._~")


def urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    return {Format.CONVERSE: model_url(endpoint, model) + "/converse"}


def stream_urls(endpoint: EndpointConfig, model: ModelConfig) -> dict[Format, str]:
    return {Format.CONVERSE: model_url(endpoint, model) + "/converse-stream"}


unserved = openai_dialect.unserved


def auth(endpoint: EndpointConfig, secret: str) -> Auth:
    """A Bedrock API key in ``keys`` as a fixed bearer; without keys, each request signed
    with SigV4 from the standard AWS chain (one signer per target: aws_sigv4.py)."""
    what = f'endpoint "{endpoint.name}" (api = "bedrock"{"" if secret else ", keys = []"})'
    aws_eventstream.require_aws(what)  # at start, not at the first request
    if secret:
        return Auth({"authorization": f"Bearer {secret}"})
    return Auth({}, aws_sigv4.Signer(endpoint.region, what).sign)


caller_headers = openai_dialect.caller_headers  # a caller's headers add nothing here


def framing() -> EventStreamFraming:
    return EventStreamFraming()


has_body_rules = openai_dialect.has_body_rules  # the format's body is Bedrock's as it is
body_rules = openai_dialect.body_rules
