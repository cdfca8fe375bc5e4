"""The gateway's tests: ``parser`` runs a test on each HTTP parser the gateway serves with."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["httptools", "h11"])
def parser(request: pytest.FixtureRequest) -> str:
    """The ``[gateway]`` line that chooses the parser."""
    return f'http = "{request.param}"'
