"""A task and a reward of this package.

>>> [p.text for p in EvenDigits(prompts=2, seed=0).batch(0)]
['copy 6820:', 'copy 886:']
>>> exact_copy("copy 42:", " 42", target="42"), exact_copy("copy 42:", " 4", target="42")
(1.0, 0.0)
"""

from __future__ import annotations

import random

from omnigraph.sdk import Prompt

EVEN = "02468"


class EvenDigits:
    """``copy <n>:`` for numbers written with even digits only (``min_digits`` to ``max_digits`` of them, its
    options: ``task: {name: even_digits, options: {max_digits: 5}}``); a held-out set of its own."""

    def __init__(self, prompts: int, seed: int = 0, eval_prompts: int = 32, min_digits: int = 3,
                 max_digits: int = 4):
        self.prompts, self.seed, self.eval_prompts = prompts, seed, eval_prompts
        self.digits = (min_digits, max_digits)

    def _draw(self, rng: random.Random) -> Prompt:
        first = rng.choice(EVEN[1:])
        number = first + "".join(rng.choice(EVEN) for _ in range(rng.randint(*self.digits) - 1))
        return Prompt(f"copy {number}:", {"target": number})

    def batch(self, step: int) -> list[Prompt]:
        rng = random.Random(f"even:{self.seed}:{step}")
        return [self._draw(rng) for _ in range(self.prompts)]

    def eval_set(self) -> list[Prompt]:
        rng = random.Random(f"even-eval:{self.seed}")
        return [self._draw(rng) for _ in range(self.eval_prompts)]


def exact_copy(prompt: str, completion: str, *, target: str, **meta) -> float:
    """1 when the first word of the completion is the target, else 0."""
    words = completion.split()
    return float(bool(words) and words[0] == target)
