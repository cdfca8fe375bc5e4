"""What a model may be asked to do that not every model can: the features a request needs
and a model has or lacks (routing skips a model that lacks one the request needs; see
capmon/core/providers/capabilities.py)."""

from __future__ import annotations

import enum


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
