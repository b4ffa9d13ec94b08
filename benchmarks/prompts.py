"""Natural chat prompts for the engine and end-to-end benchmarks.

Varied templates and topics, a fifth of them with a pasted text to summarise so
prompt lengths vary; answered greedily, a small instruct model stops on its own
after tens to a few hundred tokens, so output lengths have a real distribution
(the controller's hazard fit needs events, not only ``max_tokens`` caps).
"""

from __future__ import annotations

import random

TOPICS = (
    "the sea",
    "a library",
    "winter mornings",
    "baking bread",
    "night trains",
    "the moon",
    "chess openings",
    "rain in a city",
    "honey bees",
    "old maps",
    "volcanoes",
    "a lighthouse",
    "paper airplanes",
    "jazz",
    "the desert",
    "a clockmaker",
    "glaciers",
    "street markets",
    "owls",
    "bicycles",
    "coral reefs",
    "tea",
    "a quiet village",
    "thunderstorms",
    "ancient Rome",
    "robots",
    "a garden in spring",
    "rivers",
    "kites",
)
TEMPLATES = (
    "Write two sentences about {t}.",
    "Give three facts about {t}.",
    "Write a short poem about {t}.",
    "Explain {t} to a child in one paragraph.",
    "List five words related to {t}.",
    "Describe {t} in detail.",
    "What is the most surprising thing about {t}? Answer briefly.",
)
PARAGRAPH = (
    "Exclusive batching runs prefill steps and decode steps separately, while mixed batching puts "
    "prompt chunks and decodes into the same step. Which one is faster depends on the hardware and "
    "on the lengths of prompts and answers. "
)


def chat_requests(n: int, seed: int) -> list[list[dict]]:
    """``n`` single-turn chats (OpenAI message lists), reproducible from ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = rng.choice(TEMPLATES).format(t=rng.choice(TOPICS))
        if i % 5 == 0:
            text = "Summarise this text in one sentence: " + PARAGRAPH * rng.randint(1, 8)
        out.append([{"role": "user", "content": text}])
    return out
