"""What goes into and comes out of the FallbackClient."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from capmon.core.types.config import EndpointApi
from capmon.core.types.failure import Kind
from capmon.core.types.prices import Tokens


class Decision(enum.StrEnum):
    """What the client did after an attempt."""

    OK = "ok"
    RETRY = "retry"
    FALLBACK = "fallback"
    PARK = "park"  # a batch item put aside to come back later
    FAIL = "fail"
    SKIP = "skip"  # not sent: the request passed the target over (``Attempt.skip`` says why)
    # A stream that broke after output reached the caller, its answer continued by the next
    # attempt (capmon/core/routing/continuation.py): that attempt's ``continues`` says from where.
    CONTINUE = "continue"


class Skip(enum.StrEnum):
    """Why a request passed a target over, never sending to it (an ``Attempt`` with
    ``Decision.SKIP``): what ``x-capmon-skipped``, the access log, the audit, the traces and
    ``capmon report --item`` name."""

    INCAPABLE = "incapable"  # it cannot carry something the request uses (the detail says what)
    WINDOW = "window"  # its context window is too small for the prompt
    TRIPPED = "tripped"  # its breaker was tripped by hand
    OPEN = "open"  # its breaker is open (or its one probe is out): it admits no request now
    KEY_DISABLED = "key_disabled"  # its key was refused (auth): disabled until reset by hand
    KEY_PARKED = "key_parked"  # its key is out of quota until a reset
    UNREACHABLE = "unreachable"  # its endpoint could not be connected to at its last attempt
    SILENT = "silent"  # it sent no response headers in time: its breaker is open until its probe answers
    HELD_OFF = "held_off"  # a server's hint, or its rpm / tpm bucket, holds it off for now
    FULL = "full"  # every slot it has is in use (its limit, or a ramp's share of it)


class Priority(enum.StrEnum):
    """Who waits first when capacity is scarce: interactive requests get free slots
    before batch ones, and batch keeps a guaranteed share (``[client] batch_share``)."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


class Format(enum.StrEnum):
    """Which request format a request speaks (the caller's), or an attempt sends (the target's)."""

    CHAT = "chat"  # OpenAI's /chat/completions
    RESPONSES = "responses"  # OpenAI's /responses
    MESSAGES = "messages"  # Anthropic's /v1/messages
    GEMINI = "gemini"  # Google's generateContent (the Gemini API, Vertex AI)
    CONVERSE = "converse"  # AWS Bedrock's Converse API


@dataclass(frozen=True, slots=True)
class Request:
    """One request (chat completions, the Responses API or Anthropic's Messages), before routing.

    ``model`` (optional) is the model to try first; the rest of the preference
    list still serves as fallbacks. A model pinned by hand wins over it.
    ``deadline`` (seconds) shortens the config's ``[client] deadline`` for this request.
    ``first_token_timeout`` (seconds; 0: off) replaces ``[client] first_token_timeout`` for
    this request, and applies to a plain request too (to its whole answer, which is when a
    plain answer's first token arrives).
    """

    messages: tuple[Mapping[str, Any], ...]
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    item_id: str | None = None  # for events and audit: which batch item this is
    job: str | None = None
    priority: Priority = Priority.INTERACTIVE
    deadline: float | None = None
    format: Format = Format.CHAT  # the caller's: chat completions, the Responses API or Anthropic's Messages
    # Anthropic beta features the caller asked for (its ``anthropic-beta`` header): sent on
    # to an Anthropic-wire target that serves the request in its own format, nowhere else.
    betas: tuple[str, ...] = ()
    # The caller's id for the request (the gateway's x-request-id): on its events and audit
    # records, so one request is found in each. None: a library call that gave none.
    request_id: str | None = None
    first_token_timeout: float | None = None  # seconds; None: the config's; 0: off
    # Whether a stream that breaks after output is continued by the next attempt (None: the
    # config's ``[client] continuations``; False: the caller opted out, the break ends the stream).
    continuation: bool | None = None
    # False: served by ``model`` or not at all, never a fallback (``capmon batch compare`` asks the
    # preferred model itself for an answer a fallback gave).
    fallback: bool = True

    @staticmethod
    def of(
        messages: Any,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        item_id: str | None = None,
        job: str | None = None,
        priority: Priority = Priority.INTERACTIVE,
        deadline: float | None = None,
        request_id: str | None = None,
        first_token_timeout: float | None = None,
        continuation: bool | None = None,
        **extra: Any,
    ) -> Request:
        """A request from text or messages; any other keyword (tools, response_format,
        stream_options, ...) is sent to the provider untouched."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        nested = extra.pop("extra", None)
        if isinstance(nested, Mapping):  # Request.of(..., extra={...}) reads as the fields themselves
            extra = {**nested, **extra}
        return Request(
            messages=tuple(messages),
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            extra=extra,
            item_id=item_id,
            job=job,
            priority=Priority(priority),
            deadline=deadline,
            request_id=request_id,
            first_token_timeout=first_token_timeout,
            continuation=continuation,
        )

    @staticmethod
    def of_body(
        fmt: Format,
        body: Mapping[str, Any],
        *,
        model: str | None = None,
        priority: Priority = Priority.INTERACTIVE,
        deadline: float | None = None,
        item_id: str | None = None,
        betas: tuple[str, ...] = (),
        request_id: str | None = None,
        first_token_timeout: float | None = None,
        continuation: bool | None = None,
    ) -> Request:
        """A request in ``fmt``, its own format (the Responses API, Anthropic's Messages,
        Gemini's generateContent): ``body`` is sent as it is to a target of that format, but
        ``model``, ``stream`` and the token cap (``max_output_tokens``, ``max_tokens``,
        ``generationConfig.maxOutputTokens``), which the client owns; to a target of another
        format it is translated, or that target is skipped."""
        cap: object = body
        for name in _CAP_FIELD[fmt]:
            cap = cap.get(name) if isinstance(cap, Mapping) else None
        return Request(
            messages=(),
            model=model,
            max_tokens=caller_cap(cap),
            extra=dict(body),
            item_id=item_id,
            priority=Priority(priority),
            deadline=deadline,
            format=fmt,
            betas=betas,
            request_id=request_id,
            first_token_timeout=first_token_timeout,
            continuation=continuation,
        )

    @staticmethod
    def responses(body: Mapping[str, Any], **kw: Any) -> Request:
        """A Responses API request (see :meth:`of_body`)."""
        return Request.of_body(Format.RESPONSES, body, **kw)

    @staticmethod
    def anthropic(body: Mapping[str, Any], **kw: Any) -> Request:
        """An Anthropic Messages request (see :meth:`of_body`)."""
        return Request.of_body(Format.MESSAGES, body, **kw)


def caller_cap(value: object) -> int | None:
    """A token cap as a caller gave it in a body: a whole number above 0, else none."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# Where each format's body holds the caller's token cap (Gemini's and Converse's are nested).
_CAP_FIELD: Mapping[Format, tuple[str, ...]] = {
    Format.CHAT: ("max_tokens",),
    Format.RESPONSES: ("max_output_tokens",),
    Format.MESSAGES: ("max_tokens",),
    Format.GEMINI: ("generationConfig", "maxOutputTokens"),
    Format.CONVERSE: ("inferenceConfig", "maxTokens"),
}


@dataclass(frozen=True, slots=True)
class Attempt:
    number: int
    model: str
    target: str
    endpoint: str
    key_alias: str
    started: float  # wall clock
    status: int | None
    kind: Kind | None  # None: the attempt succeeded
    reason: str
    hint: float | None  # server hint, seconds
    wait: float  # how long the client waited after this attempt before the next one
    latency: float
    decision: Decision
    api: EndpointApi = EndpointApi.OPENAI  # the API of the target's endpoint
    dropped: tuple[str, ...] = ()  # fields left out because the target's API version refuses them
    skip: Skip | None = None  # Decision.SKIP: why it was passed over (``reason``: the detail)
    # An attempt that continued a broken answer: the characters of the answer the caller had
    # already been sent when it began (its output follows them). None: it began an answer.
    continues: int | None = None
    # The id the target's endpoint knows the model by (its deployment's): the model's name at
    # most endpoints, another id where a deployment sets one. "" from a source older than it.
    deployment: str = ""
    # The answer's (Decision.OK only): its token counts as told, and what they cost at the
    # target's prices (None: no price known, or no counts told).
    tokens: Tokens | None = None
    cost: float | None = None


@dataclass(frozen=True, slots=True)
class Continued:
    """One continuation of a streamed answer: the model that went on with it, and the
    answer's length in characters when it did (what the caller had been sent)."""

    model: str
    offset: int

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "offset": self.offset}


def continued(attempts: Sequence[Attempt]) -> tuple[Continued, ...]:
    """The continuations on a request's record, in order (none for an unbroken answer)."""
    return tuple(Continued(a.model, a.continues) for a in attempts if a.continues is not None)


def sent(attempts: Sequence[Attempt]) -> list[Attempt]:
    """The attempts that were sent: the record without its skips."""
    return [a for a in attempts if a.decision is not Decision.SKIP]


def skipped(attempts: Sequence[Attempt]) -> list[Attempt]:
    """The targets a request passed over, each with why (``skip``, ``reason``)."""
    return [a for a in attempts if a.decision is Decision.SKIP]


@dataclass(frozen=True, slots=True)
class ChatResult:
    model: str  # the model that served it (config name)
    endpoint: str
    target: str
    content: str
    response: Mapping[str, Any]
    attempts: tuple[Attempt, ...]
    latency: float  # from the call to the answer, waits included
    usage: Mapping[str, Any] = field(default_factory=dict)
    request_id: int = 0  # the client's number for the request (events and attempts carry it too)
    api: EndpointApi = EndpointApi.OPENAI  # the API that served it (the answer is in the caller's format)
    # The model the request counted on first: the one it asked for, else the pinned one, else
    # the first of the preference order. "" from a source older than this: not counted.
    requested: str = ""
    max_tokens_lowered: int | None = None  # the output cap sent when [client] cap_client_tokens cut the caller's
    # The id the serving endpoint knows the model by (the deployment that served, with endpoint)
    deployment: str = ""
    # USD at the serving target's prices (capmon/core/types/prices.py); None: no price is
    # known, the answer told no usage, or a continued stream's earlier parts were estimated
    cost: float | None = None

    @property
    def continued(self) -> tuple[Continued, ...]:
        """Who continued a streamed answer that broke, and from where (empty: it never broke)."""
        return continued(self.attempts)

    @property
    def dropped(self) -> tuple[str, ...]:
        """Fields the serving attempt left out because its API version refuses them."""
        return self.attempts[-1].dropped if self.attempts else ()

    @property
    def skipped(self) -> list[Attempt]:
        """The targets it passed over, each with why."""
        return skipped(self.attempts)

    @property
    def fell_back(self) -> bool:
        return self.fallbacks > 0

    @property
    def fallbacks(self) -> int:
        """How many times the request moved to another model, the move away from the model
        it asked for included when that one was never tried (its breaker open, tripped by hand)."""
        return fallbacks(self.requested, [a.model for a in sent(self.attempts)])

    @property
    def tool_calls(self) -> list[Mapping[str, Any]]:
        """The answer's tool calls (streamed or not), [] when there are none."""
        try:
            calls = self.response["choices"][0]["message"].get("tool_calls")
        except (KeyError, IndexError, TypeError, AttributeError):
            return []
        return list(calls) if isinstance(calls, list) else []


def fallbacks(requested: str, models: list[str]) -> int:
    """The moves between models along ``models`` (each sent attempt's, the serving one last;
    a model passed over is no stop on the way), starting from ``requested`` (the model the
    request counted on first; "" for none)."""
    path = [requested, *models] if requested else models
    return sum(1 for a, b in zip(path, path[1:], strict=False) if a != b)
