"""What a model may be asked to do that not every model can: the features a request needs
and a model has or lacks (routing skips a model that lacks one the request needs; see
capmon/core/providers/capabilities.py)."""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Feature(enum.StrEnum):
    """A feature a request may need (named as in ``capabilities = { ... }`` in the config)."""

    TOOLS = "tools"  # tools to call (a forced tool_choice among them)
    STRUCTURED_OUTPUT = "structured_output"  # a JSON schema or JSON mode for the answer
    IMAGES = "images"  # images in the prompt
    REASONING = "reasoning"  # reasoning settings: an effort, Anthropic's thinking, Gemini's thinkingConfig


class Source(enum.StrEnum):
    """Where what a model can do was read, in order of precedence."""

    CONFIG = "config"  # the deployment's capabilities, else the model's
    LEARNED = "learned"  # a provider's 400 said so, in this process
    CATALOGUE = "catalogue"  # models.dev (capmon/core/types/catalogue.py)
    ASSUMED = "assumed"  # nobody said: assumed capable


class Lessons:
    """What providers' 400s taught: per deployment (``model@endpoint``), the features its
    model lacks there, with the provider's words. One book per process, kept by the state
    (capmon/core/control/seam.py, ``StateStore.lessons``), which a fleet shares."""

    def __init__(self) -> None:
        self._lacks: dict[str, dict[Feature, str]] = {}

    def add(self, deployment: str, feature: Feature, why: str) -> bool:
        """Note that ``deployment`` lacks ``feature`` (``why``: the provider's words); False
        when it was known already."""
        known = self._lacks.setdefault(deployment, {})
        if feature in known:
            return False
        known[feature] = why
        return True

    def lacks(self, deployment: str) -> Mapping[Feature, str]:
        return self._lacks.get(deployment, {})

    def items(self) -> list[tuple[str, Feature, str]]:
        """Every lesson: (deployment, feature, the provider's words)."""
        return [(d, f, why) for d, lacks in sorted(self._lacks.items()) for f, why in lacks.items()]
