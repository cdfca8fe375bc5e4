"""capmon's one exception hierarchy.

Every error capmon raises on purpose is a :class:`CapmonError`. Messages never
contain an API key: keys are only ever referred to by their alias.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capmon.core.types.failure import Failure
    from capmon.core.types.result import Attempt


class CapmonError(Exception):
    """Base of every error capmon raises on purpose."""


class ConfigError(CapmonError):
    """A config file is wrong. Names the file, the key and what was expected."""

    def __init__(self, file: str, key: str, message: str) -> None:
        self.file = file
        self.key = key
        self.detail = message
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {message}")


class RequestFailed(CapmonError):
    """A request ended without an answer, for a reason retrying will not fix
    (auth, quota, bad request, too large for every model, budget or deadline spent)."""

    def __init__(self, failure: Failure, attempts: Sequence[Attempt] = (), message: str | None = None) -> None:
        self.failure = failure
        self.attempts = tuple(attempts)
        super().__init__(message or f"{failure.kind.value}: {failure.reason}")

    @property
    def kind(self) -> str:
        return self.failure.kind.value


class DeadlineExceeded(RequestFailed):
    """The request's overall deadline passed before any model answered in full (a stream
    that passes it after its first output ends with this too). ``passed`` says which
    deadline it was (``[client] deadline`` or the request's own) and how long after the
    request's start it was given up; ``failure`` is the last attempt's."""

    def __init__(
        self, failure: Failure, attempts: Sequence[Attempt] = (), message: str | None = None, *, passed: str = ""
    ) -> None:
        super().__init__(failure, attempts, message)
        self.passed = passed


class CredentialsError(CapmonError):
    """A key that is no fixed value could not be had: a cloud's credentials were not found,
    or their token's refresh failed (Vertex AI's, capmon/core/providers/google_token.py).
    Raised inside an attempt, which it fails like a connection that failed; its text never
    holds a token."""


class BrokenAnswer(CapmonError):
    """An answer whose every byte came but which cannot be used as it is: a tool call whose
    arguments are no JSON object, to be told in another format. Raised inside an attempt
    and taken there as its ``failure`` (capmon/core/providers/classify.py's ``classify_tool_call``), so the
    answer is tried again before output and ends the stream as broken after it."""

    def __init__(self, failure: Failure) -> None:
        self.failure = failure
        super().__init__(failure.reason)


class Unavailable(enum.StrEnum):
    """Why waiting cannot help a request: the code a gateway's error gives."""

    MODELS = "models_unavailable"  # every model it may use is tripped by hand (or held off past its deadline)
    KEYS = "no_usable_key"  # every key it may use is disabled, or out of quota past its deadline
    WINDOW = "context_length_exceeded"  # its prompt fits no model's context window
    # every endpoint it may use could not be connected to (DNS, refused, TLS, proxy) and has
    # never answered since the process started: no capacity problem, a setup one
    UNREACHABLE = "upstream_unreachable"
    # no model it may use can do what it needs (tools, structured output, images, reasoning,
    # its output cap): by the config, a provider's 400 or the catalogue; its message says which
    NO_CAPABLE = "no_capable_model"


class CannotWait(RequestFailed):
    """The request was answered at once, before or between attempts: no model it may use
    can admit it before its deadline, and only a person (a reset, a key fixed, the
    endpoint's address or network mended) or a time past the deadline (``retry_after``:
    seconds until a quota resets) changes that. A model whose breaker opened by itself, or
    that is merely full, is waited for instead."""

    def __init__(
        self,
        failure: Failure,
        why: Unavailable,
        attempts: Sequence[Attempt] = (),
        message: str | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(failure, attempts, message)
        self.why = why
        self.retry_after = retry_after


class BatchError(CapmonError):
    """A batch job cannot start or go on (bad input file, locked database, ...)."""


class SimulatorError(CapmonError):
    """The simulated provider cannot start (port taken by something else, bad scenario)."""


class MissingExtra(CapmonError, ImportError):
    """What was asked for needs an optional part of capmon (an extra of pyproject.toml)
    that is not installed: one line naming it and the command that installs it. An
    ImportError too, so that ``import capmon.inprocess`` fails as an import does."""

    def __init__(self, what: str, extra: str, module: str | None = None) -> None:
        self.what = what
        self.extra = extra
        super().__init__(f"{what} needs the {extra} extra: pip install 'capmon[{extra}]'", name=module)
