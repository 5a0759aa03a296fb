"""Rule-based rewards: plain functions ``(prompt, completion, **meta) -> float``.

A graph names one by dotted path (``fn: nodes.rewards:digits_match``), so a
user brings their own the same way.

>>> digits_match("copy 4071:", " 4071", target="4071")
1.0
>>> digits_match("copy 4071:", " 4000", target="4071")
0.5
>>> digits_match("copy 4071:", " 40712", target="4071")
0.8
>>> arithmetic_reward("What is 13 + 14?", "27", target="27")
1.0
>>> arithmetic_reward("What is 13 + 14?", "13 + 14 = 27", target="27")
0.8
>>> arithmetic_reward("What is 13 + 14?", "25", target="27")
0.2
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+")


def digits_match(prompt: str, completion: str, *, target: str, **meta) -> float:
    """Fraction of the target's digits reproduced in place, over the longer of answer and target.

    Only the first whitespace-separated word of the completion counts; extra
    or missing digits lower the score, an exact copy scores 1.0.
    """
    words = completion.split()
    answer = words[0] if words else ""
    if not answer:
        return 0.0
    hits = sum(a == b for a, b in zip(answer, target))
    return hits / max(len(answer), len(target))


def arithmetic_reward(prompt: str, completion: str, *, target: str, **meta) -> float:
    """Exact match (0.8) plus format (0.2).

    - exact match: the last number in the reply is the target;
    - format: the reply is one number and nothing else (what the prompt asks for).
    """
    numbers = NUMBER.findall(completion)
    correct = bool(numbers) and numbers[-1] == target
    formatted = NUMBER.fullmatch(completion.strip()) is not None
    return 0.8 * correct + 0.2 * formatted
