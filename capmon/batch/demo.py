"""A demo job: realistic-looking items for the dashboard and for trying capmon out."""

from __future__ import annotations

import json
import random
from pathlib import Path

_TASKS = (
    ("summarise", "Summarise this support ticket in one sentence:\n\n{text}", 96),
    ("translate", "Translate into French, keeping the tone:\n\n{text}", 256),
    (
        "classify",
        "Classify the sentiment of this review as positive, negative or neutral. Answer with one word.\n\n{text}",
        8,
    ),
    ("extract", "List the company and product names mentioned, one per line:\n\n{text}", 128),
    ("title", "Write a product title of at most ten words for:\n\n{text}", 32),
    ("reply", "Draft a short, friendly reply to this customer:\n\n{text}", 300),
)
_SUBJECTS = (
    "my order",
    "the invoice",
    "the mobile app",
    "the delivery",
    "my account",
    "the refund",
    "the new plan",
    "the headphones",
    "the subscription",
    "the warranty",
    "the login page",
    "the export feature",
)
_FEELINGS = (
    "arrived two days late",
    "works better than expected",
    "keeps logging me out",
    "was charged twice",
    "is missing a part",
    "is exactly what I needed",
    "stopped syncing after the update",
    "has a confusing settings screen",
    "was easy to set up",
    "never showed up",
)
_CLOSERS = (
    "Can you help?",
    "Thanks a lot.",
    "Please advise.",
    "I would like a refund.",
    "Great job, team.",
    "This is the third time I write.",
    "Is there a workaround?",
    "",
)
_SOURCES = ("email", "chat", "app-store", "web-form", "phone-transcript")


def _text(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(1, 4)):
        sentences.append(
            f"{rng.choice(('Hi', 'Hello', 'So', 'Also', 'Honestly'))}, {rng.choice(_SUBJECTS)} {rng.choice(_FEELINGS)}."
        )
    closer = rng.choice(_CLOSERS)
    return " ".join(sentences + ([closer] if closer else []))


def write_demo_input(path: Path, n: int, seed: int = 0) -> Path:
    """Write ``n`` items (ids ``demo-00001`` ...) to ``path``; the same seed gives the same file."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    width = max(5, len(str(n)))
    with open(path, "w", encoding="utf-8") as f:
        for i in range(1, n + 1):
            task, template, max_tokens = rng.choice(_TASKS)
            item = {
                "id": f"demo-{i:0{width}d}",
                "messages": [
                    {"role": "system", "content": "You are a careful assistant for a customer-support team."},
                    {"role": "user", "content": template.format(text=_text(rng))},
                ],
                "max_tokens": max_tokens,
                "metadata": {"task": task, "source": rng.choice(_SOURCES), "customer": rng.randint(1000, 99999)},
            }
            f.write(json.dumps(item, ensure_ascii=False))
            f.write("\n")
    return path
