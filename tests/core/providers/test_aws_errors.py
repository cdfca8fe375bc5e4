"""AWS Bedrock's errors in their real wordings: each as the HTTP error it is (named by
``x-amzn-ErrorType``, or by the body's ``__type`` when no header says), and inside a
ConverseStream (an exception frame, named in lowerCamel case), classified by its type alike:
never by the 400 a decoder gives every exception frame."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from capmon.core.control.policy import BY_CODE, policy_for
from capmon.core.providers import converse_format
from capmon.core.providers.aws_eventstream import EventStreamFraming
from capmon.core.providers.classify import classify_aws_event, classify_response
from capmon.core.providers.frames import FrameKind
from capmon.core.types.failure import INFERENCE_PROFILE_REQUIRED, MODEL_NOT_FOUND, Failure, Kind
from tests.support import eventstream as es

NOW = 1_767_225_600.0
PROFILE = (
    "Invocation of model ID anthropic.claude-sonnet-4-5-20250929-v1:0 with on-demand throughput isn\u2019t"
    " supported. Retry your request with the ID or ARN of an inference profile that contains this model."
)


@dataclass(frozen=True)
class Case:
    name: str
    exception: str
    status: int
    message: str
    kind: Kind
    code: str | None = None  # None: the exception's name

    @property
    def failure_code(self) -> str:
        return self.code or self.exception


CASES = [
    Case(
        "throttled-requests",
        "ThrottlingException",
        429,
        "Too many requests, please wait before trying again.",
        Kind.RATE_LIMITED,
    ),
    Case(
        "throttled-tokens",
        "ThrottlingException",
        429,
        "Too many tokens, please wait before trying again.",
        Kind.RATE_LIMITED,
    ),
    Case(
        "throttled-per-day",
        "ThrottlingException",
        429,
        "Too many tokens per day, please wait before trying again.",
        Kind.QUOTA,
    ),
    Case(
        "unavailable", "ServiceUnavailableException", 503, "Bedrock is unable to process your request.", Kind.CAPACITY
    ),
    Case(
        "connections",
        "ServiceUnavailableException",
        503,
        "Too many connections, please wait before trying again.",
        Kind.CAPACITY,
    ),
    Case(
        "not-ready",
        "ModelNotReadyException",
        429,
        "Model is not ready for inference. Wait and try your request again.",
        Kind.CAPACITY,
    ),
    Case(
        "model-timeout",
        "ModelTimeoutException",
        408,
        "Model has timed out in processing the request. Try your request again.",
        Kind.TRANSIENT,
    ),
    Case("model-error", "ModelErrorException", 424, "Received error from model", Kind.TRANSIENT),
    Case(
        "internal",
        "InternalServerException",
        500,
        "The system encountered an unexpected error during processing. Try your request again.",
        Kind.TRANSIENT,
    ),
    Case(
        "service-quota",
        "ServiceQuotaExceededException",
        400,
        "Your request exceeds the service quota for your account. You can view your quotas at Viewing service"
        " quotas. You can resubmit your request later.",
        Kind.QUOTA,
    ),
    Case("input-too-long", "ValidationException", 400, "Input is too long for requested model.", Kind.TOO_LARGE),
    Case(
        "prompt-too-long",
        "ValidationException",
        400,
        "The model returned the following errors: prompt is too long: 215000 tokens > 200000 maximum",
        Kind.TOO_LARGE,
    ),
    Case(
        "validation",
        "ValidationException",
        400,
        "1 validation error detected: Value '0' at 'inferenceConfig.maxTokens' failed to satisfy constraint: Member"
        " must have value greater than or equal to 1",
        Kind.BAD_REQUEST,
    ),
    Case("on-demand", "ValidationException", 400, PROFILE, Kind.BAD_REQUEST, INFERENCE_PROFILE_REQUIRED),
    Case(
        "invalid-id",
        "ValidationException",
        400,
        "The provided model identifier is invalid.",
        Kind.BAD_REQUEST,
        MODEL_NOT_FOUND,
    ),
    Case(
        "not-found",
        "ResourceNotFoundException",
        404,
        "Could not resolve the foundation model from the provided model identifier.",
        Kind.BAD_REQUEST,
        MODEL_NOT_FOUND,
    ),
    Case(
        "access",
        "AccessDeniedException",
        403,
        "You don't have access to the model with the specified model ID.",
        Kind.AUTH,
    ),
    Case(
        "unrecognized",
        "UnrecognizedClientException",
        403,
        "The security token included in the request is invalid.",
        Kind.AUTH,
    ),
    Case("expired", "ExpiredTokenException", 403, "The security token included in the request is expired", Kind.AUTH),
]
IDS = [c.name for c in CASES]


def error_type(exception: str) -> str:
    return f"{exception}:http://internal.amazon.com/coral/com.amazon.bedrock/"


def check(failure: Failure | None, case: Case) -> None:
    assert failure is not None
    assert (failure.kind, failure.code, failure.status) == (case.kind, case.failure_code, case.status)
    assert case.message[:40] in failure.reason and case.exception in failure.reason


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bedrocks_http_errors_by_their_error_type_header(case: Case) -> None:
    body = json.dumps({"message": case.message}).encode()
    headers = {"x-amzn-ErrorType": error_type(case.exception), "content-type": "application/json"}
    check(classify_response(case.status, headers, body, now=NOW), case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bedrocks_http_errors_by_the_bodys_type_when_no_header_says(case: Case) -> None:
    body = json.dumps({"__type": f"com.amazon.coral.service#{case.exception}", "Message": case.message}).encode()
    check(classify_response(case.status, {}, body, now=NOW), case)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_an_exception_inside_a_stream_counts_as_the_http_error_it_names(case: Case) -> None:
    """Named in lowerCamel case, its status the one the exception comes with over HTTP (never
    the 400 botocore gives every exception frame)."""
    lower = case.exception[0].lower() + case.exception[1:]
    framing = EventStreamFraming()
    frames = framing.feed(b"".join([*es.converse_stream()[:2], es.exception(lower, case.message)]))
    events = [converse_format.read_frame(f, now=NOW) for f in frames]
    assert [e.kind for e in events] == [FrameKind.CHUNK, FrameKind.CHUNK, FrameKind.ERROR]
    check(events[-1].failure, case)
    assert events[-1].failure is not None and events[-1].failure.reason.startswith("error inside the stream: ")


def test_the_on_demand_error_says_what_to_configure_and_parks_the_target_as_a_missing_model_does() -> None:
    failure = classify_response(
        400, {"x-amzn-ErrorType": error_type("ValidationException")}, json.dumps({"message": PROFILE})
    )
    assert failure is not None and "inference profile" in failure.reason and '"us.<model id>"' in failure.reason
    assert policy_for(failure) is BY_CODE[INFERENCE_PROFILE_REQUIRED] == BY_CODE[MODEL_NOT_FOUND]


def test_a_throttling_told_to_wait_an_hour_is_a_quota() -> None:
    headers = {"x-amzn-ErrorType": "ThrottlingException", "retry-after": "7200"}
    failure = classify_response(
        429, headers, b'{"message": "Too many requests, please wait before trying again."}', now=NOW
    )
    assert failure is not None and failure.kind is Kind.QUOTA and failure.retry_after == 7200


def test_a_stream_error_frame_of_an_unknown_code_is_transient() -> None:
    failure = classify_aws_event(
        "InternalFailure", json.dumps({"message": "We encountered an internal error."}), now=NOW
    )
    assert (failure.kind, failure.code) == (Kind.TRANSIENT, "InternalFailure")


def test_a_model_stream_error_is_transient_whatever_status_its_model_gave() -> None:
    payload = json.dumps({"message": "Model stream error", "originalStatusCode": 400, "originalMessage": "boom"})
    failure = classify_aws_event("modelStreamErrorException", payload, now=NOW)
    assert (failure.kind, failure.status, failure.code) == (Kind.TRANSIENT, 424, "ModelStreamErrorException")


def test_an_error_type_capmon_does_not_know_goes_by_its_status() -> None:
    failure = classify_response(
        400, {"x-amzn-ErrorType": "SerializationException"}, b'{"message": "Start of structure"}'
    )
    assert failure is not None and failure.kind is Kind.BAD_REQUEST
