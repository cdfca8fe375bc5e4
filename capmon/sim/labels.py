"""Deterministic labels for classification prompts, so a test knows how often two models differ.

A prompt whose last user message starts with :data:`MARKER` is answered by a model with
``labels`` (``[[models]] labels = [...]`` in a scenario) with one label: the one a hash of
the prompt picks, the same for every model, so two models agree by default. A model with
``disagree = p`` answers the next label instead on the prompts whose second hash falls
below ``p``: a share ``p`` of prompts, the same prompts on every run. The batch's
``capmon batch compare`` measures that share back (tests/batch/test_compare.py).
"""

from __future__ import annotations

import hashlib

MARKER = "Classify:"


def _unit(*parts: str) -> float:
    """A number in [0, 1) from a hash of ``parts``: stable across processes (unlike hash())."""
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def true_label(labels: tuple[str, ...], prompt: str) -> str:
    return labels[int(_unit("label", prompt) * len(labels))]


def disagrees(prompt: str, share: float) -> bool:
    """Whether a model with ``disagree = share`` answers another label than :func:`true_label`."""
    return _unit("disagree", prompt) < share


def label_for(labels: tuple[str, ...], disagree: float, prompt: str | None) -> str | None:
    """The label a model answers ``prompt`` (its last user message) with; None when it has
    no labels or the prompt does not ask to classify."""
    if not labels or prompt is None or not prompt.lstrip().startswith(MARKER):
        return None
    label = true_label(labels, prompt)
    if len(labels) > 1 and disagrees(prompt, disagree):
        return labels[(labels.index(label) + 1) % len(labels)]
    return label
