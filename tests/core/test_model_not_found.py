"""A 404 that says the target's model is not there, in each provider's words, is a bad
request with the code ``model_not_found``: its target is parked and the request goes on
(policy.py); any other 404 stays a plain bad request that fails the request."""

from __future__ import annotations

import json

import pytest

from capmon.core.control.policy import KeyAction, Next, policy_for
from capmon.core.providers.classify import classify_response
from capmon.core.types.failure import MODEL_NOT_FOUND, Kind

pytestmark = pytest.mark.unit

MISSING = {
    "openai": {
        "error": {
            "message": "The model `gpt-9` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    },
    "anthropic": {"type": "error", "error": {"type": "not_found_error", "message": "model: claude-opus-9"}},
    "azure": {
        "error": {
            "code": "DeploymentNotFound",
            "message": "The API deployment for this resource does not exist. If you created the deployment "
            "within the last 5 minutes, please wait a moment and try again.",
        }
    },
    "gemini": {
        "error": {
            "code": 404,
            "message": "models/gemini-1.0-pro is not found for API version v1beta, or is not supported for "
            "generateContent. Call ListModels to see the list of available models and their supported methods.",
            "status": "NOT_FOUND",
        }
    },
    "vertex": [
        {
            "error": {
                "code": 404,
                "message": "Publisher Model `projects/p/locations/us-east5/publishers/anthropic/models/claude-x` "
                "was not found or your project does not have access to it.",
                "status": "NOT_FOUND",
            }
        }
    ],
}


@pytest.mark.parametrize("provider", sorted(MISSING))
def test_a_missing_model_parks_its_target_and_the_request_goes_on(provider: str) -> None:
    failure = classify_response(404, {}, json.dumps(MISSING[provider]))
    assert failure is not None and failure.kind is Kind.BAD_REQUEST and failure.code == MODEL_NOT_FOUND
    policy = policy_for(failure)
    assert (policy.key, policy.next) == (KeyAction.PARK, Next.FALLBACK)


def test_any_other_404_fails_the_request() -> None:
    other = {"error": {"message": "No such file: file-abc", "type": "invalid_request_error", "code": None}}
    failure = classify_response(404, {}, json.dumps(other))
    assert failure is not None and failure.kind is Kind.BAD_REQUEST and failure.code != MODEL_NOT_FOUND
    assert policy_for(failure).next is Next.FAIL
