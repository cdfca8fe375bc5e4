"""`[gateway] aliases` with patterns (fnmatch's ``*``, ``?``, ``[...]``): a model's name and
an exact alias win over any pattern, the most specific pattern (most characters outside its
wildcards) wins over the others, a tie goes to the table's order; through the real openai and
anthropic SDKs each answer says the model that served and the name it asked for."""

from __future__ import annotations

import anthropic
import openai
import pytest

from capmon.gateway.errors import ApiError
from capmon.gateway.models import ModelNames, literal_chars
from capmon.gateway.settings import load_settings
from tests.gateway.helpers import HELLO, config, running

# In table order: the tie between "*-mini" and "gpt-5*" (5 literal characters each) goes to "*-mini".
ALIASES = (
    'aliases = { "claude-*" = "auto", "claude-haiku-*" = "small", "*-mini" = "medium", "gpt-5*" = "small", '
    '"gpt-5" = "flagship", "*ium" = "small", "o[34]-?" = "medium" }'
)


def names() -> ModelNames:
    settings = load_settings(config("http://127.0.0.1:9/v1", gateway=ALIASES), environ={})
    return ModelNames(settings.models, settings.aliases)


@pytest.mark.parametrize(
    "asked, model",
    [
        ("claude-opus-4-8", None),  # claude-*: the preference order
        ("claude-haiku-4-5-20251001", "small"),  # claude-haiku-* (13 literal characters) over claude-* (7)
        ("claude-haiku-mini", "small"),  # ... and over *-mini (5)
        ("gpt-5-mini", "medium"),  # *-mini and gpt-5* tie at 5: the first in the table
        ("gpt-5.1-codex", "small"),
        ("gpt-5", "flagship"),  # an exact alias wins over gpt-5*
        ("medium", "medium"),  # a model's own name wins over *ium
        ("premium", "small"),
        ("auto", None),
        ("o3-x", "medium"),  # [34] and ? are fnmatch's
        ("claude-" + "x" * 1000, None),  # past the cache's name length: matched all the same
    ],
)
def test_which_alias_a_name_takes(asked: str, model: str | None) -> None:
    n = names()
    assert n.resolve(asked) == model and n.accepts(asked)


def test_patterns_are_ranked_once_and_matched_whole_and_by_case() -> None:
    n = names()
    assert [p.pattern for p in n.patterns] == ["claude-haiku-*", "claude-*", "*-mini", "gpt-5*", "*ium", "o[34]-?"]
    assert [literal_chars(p) for p in ("a*b?c", "[!]x]y", "x[", "[abc")] == [3, 1, 2, 4]
    for unknown in ("Claude-opus-4-8", "my-claude-opus", "o5-x", "o3-xy"):  # case-sensitive, anchored
        assert not n.accepts(unknown)
        with pytest.raises(ApiError, match="does not exist on this gateway"):
            n.resolve(unknown)
    # a pattern's match is not one of the gateway's own names: it is echoed only once redacted
    assert n.known("gpt-5") and not n.known("claude-opus-4-8")


@pytest.mark.looptime
async def test_a_name_a_pattern_matches_is_served_and_named_by_the_sdks() -> None:
    async with running(gateway=ALIASES) as gw, gw.openai() as sdk:
        opus = await sdk.chat.completions.with_raw_response.create(model="claude-opus-4-8", messages=HELLO)
        haiku = await sdk.responses.with_raw_response.create(model="claude-haiku-4-5-20251001", input="Say hi")
        entry = await sdk.models.retrieve("claude-opus-4-8")
        listed = [m.id async for m in sdk.models.list()]
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.chat.completions.create(model="Claude-opus-4-8", messages=HELLO)
        async with gw.anthropic() as claude:
            raw = await claude.messages.with_raw_response.create(
                model="claude-opus-4-8", max_tokens=64, messages=[{"role": "user", "content": "Say hi"}]
            )
            with pytest.raises(anthropic.NotFoundError):
                await claude.messages.create(
                    model="llama-3", max_tokens=64, messages=[{"role": "user", "content": "x"}]
                )
    assert (opus.headers["x-capmon-model"], opus.headers["x-capmon-requested-model"]) == ("flagship", "claude-opus-4-8")
    assert opus.parse().model == "sim-flagship"
    assert (haiku.headers["x-capmon-model"], haiku.headers["x-capmon-requested-model"]) == (
        "small",
        "claude-haiku-4-5-20251001",
    )
    assert haiku.parse().model == "sim-small"
    assert raw.headers["x-capmon-model"] == "flagship" and raw.headers["x-capmon-requested-model"] == "claude-opus-4-8"
    answer = await raw.parse()
    assert answer.model == "sim-flagship" and answer.content[0].type == "text"
    assert entry.id == "claude-opus-4-8" and entry.model_extra == {
        "capmon_alias_of": None,
        "capmon_pattern": "claude-*",
    }
    assert listed == ["flagship", "medium", "small", "auto", "gpt-5"]  # a pattern is no model's id
    assert missing.value.code == "model_not_found" and "claude-*" in missing.value.message
