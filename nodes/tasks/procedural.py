"""Prompt sets (registered under ``omnigraph.tasks``). A task yields batches of prompts, deterministically
from its seed: the same step always gets the same prompts (a resumed run and a regenerated batch ask again).

``arithmetic`` (for a small instruct model): ``"What is 13 + 14? Reply with
just the number."``, target ``"27"``, in the model's chat template.

``digits``: each prompt shows a number and asks for its digits back, e.g.
``"copy 4071:"`` with target ``"4071"``. The reward
(:func:`nodes.rewards.rules.digits_match`) scores the completion position by
position, so partial answers earn partial credit and RL has a gradient to
follow. Numbers whose hash falls in the held-out slice never appear in
training batches: they are the eval split.

>>> task = Digits(prompts=2, seed=0)
>>> [p.text for p in task.batch(0)]
['copy 667:', 'copy 908:']
>>> task.batch(0)[0].meta
{'target': '667'}
"""

from __future__ import annotations

import random
import zlib

from pydantic import Field

from omnigraph.sdk import Options, Prompt


class Task:
    """A prompt stream: ``_draw(rng, held_out)`` makes one prompt of the training or held-out split;
    training batches and the eval set are drawn from seeds, so they are the same every time."""

    prompts: int
    seed: int
    eval_prompts: int
    eval_every: int
    chat = False

    def _held_out(self, key: str) -> bool:
        return zlib.crc32(key.encode()) % self.eval_every == 0

    def _draw(self, rng: random.Random, held_out: bool) -> Prompt:
        raise NotImplementedError

    def batch(self, step: int) -> list[Prompt]:
        """The prompts of training step ``step`` (the same every time it is asked)."""
        rng = random.Random(f"{self.seed}:train:{step}")
        return [self._draw(rng, held_out=False) for _ in range(self.prompts)]

    def eval_set(self) -> list[Prompt]:
        rng = random.Random(f"{self.seed}:eval")
        return [self._draw(rng, held_out=True) for _ in range(self.eval_prompts)]


class Digits(Task):
    """Copy a number of ``min_len..max_len`` digits; 1 in ``eval_every`` numbers is held out.

    ``long_share`` of the numbers (0 by default) are long instead, ``max_len + 1 .. long_len`` digits: a heavy
    tail of long completions among short ones (what partial rollouts are for).

    >>> [p.meta["target"] for p in Digits(prompts=6, seed=1, long_share=0.3).batch(0)]
    ['129', '4352532', '3392', '128', '1718', '1015']
    """

    class Options(Options):
        """``task.options`` of ``digits``."""

        min_len: int = Field(3, ge=1, le=1000)
        """Fewest digits of a number."""
        max_len: int = Field(4, ge=1, le=1000)
        """Most digits of a number (the long tail aside)."""
        eval_every: int = Field(10, ge=2, le=1_000_000)
        """One number in this many (by a hash of it) is held out: the eval split."""
        long_share: float = Field(0.0, ge=0, le=1)
        """The share of numbers drawn long instead, ``max_len + 1 .. long_len`` digits."""
        long_len: int = Field(30, ge=1, le=1000)
        """Most digits of a long number."""

    def __init__(self, prompts: int, seed: int = 0, min_len: int = 3, max_len: int = 4,
                 eval_prompts: int = 64, eval_every: int = 10, long_share: float = 0.0, long_len: int = 30):
        self.prompts = prompts
        self.seed = seed
        self.min_len, self.max_len = min_len, max_len
        self.eval_prompts = eval_prompts
        self.eval_every = eval_every
        self.long_share, self.long_len = long_share, long_len

    def _draw(self, rng: random.Random, held_out: bool) -> Prompt:
        while True:
            if self.long_share and rng.random() < self.long_share:
                n = rng.randint(self.max_len + 1, self.long_len)
            else:
                n = rng.randint(self.min_len, self.max_len)
            number = str(rng.randint(10 ** (n - 1), 10 ** n - 1))
            if self._held_out(number) == held_out:
                return Prompt(f"copy {number}:", {"target": number})


class Arithmetic(Task):
    """Add two numbers of ``1..max_operand``; the reply should be the sum and nothing else.

    A chat task: the rollout wraps each prompt in the model's chat template, after the system
    message ``SYSTEM``. Pairs whose hash falls in the held-out slice are the eval split. Scored by
    :func:`nodes.rewards.rules.arithmetic_reward`.

    >>> p = Arithmetic(prompts=1, seed=0).batch(0)[0]
    >>> p.text, p.meta, p.chat
    ('What is 5 + 18? Reply with just the number.', {'target': '23'}, True)
    """

    chat = True
    SYSTEM = "You are a helpful assistant. You answer arithmetic questions correctly."

    class Options(Options):
        """``task.options`` of ``arithmetic``."""

        max_operand: int = Field(20, ge=1, le=10**9)
        """Operands are drawn from ``1..max_operand``."""
        eval_every: int = Field(10, ge=2, le=1_000_000)
        """One pair in this many (by a hash of it) is held out: the eval split."""

    def __init__(self, prompts: int, seed: int = 0, max_operand: int = 20, eval_prompts: int = 64,
                 eval_every: int = 10):
        self.prompts, self.seed, self.max_operand = prompts, seed, max_operand
        self.eval_prompts, self.eval_every = eval_prompts, eval_every

    def _draw(self, rng: random.Random, held_out: bool) -> Prompt:
        while True:
            a, b = rng.randint(1, self.max_operand), rng.randint(1, self.max_operand)
            if self._held_out(f"{a}+{b}") == held_out:
                return Prompt(f"What is {a} + {b}? Reply with just the number.", {"target": str(a + b)},
                              chat=True, system=self.SYSTEM)


class Multiply(Task):
    """Multiply two ``digits``-digit numbers with a calculator tool (environment ``calculator``).

    A chat task for an instruct model: the system message explains the tool (``<calc>...</calc>`` is
    answered with ``<result>...</result>``; the final reply is ``<answer>N</answer>``) and one solved
    conversation shows it in use, so the model has seen the protocol once; whether it calls the tool
    with the right numbers and copies the result is what RL teaches. SmolLM2-135M cannot multiply
    3-digit numbers alone.

    >>> p = Multiply(prompts=1, seed=0).batch(0)[0]
    >>> p.text, p.meta
    ('What is 253 * 667?', {'target': '168751'})
    >>> [m["role"] for m in p.messages]
    ['system', 'user', 'assistant', 'user', 'assistant', 'user']
    """

    chat = True
    SYSTEM = ("You can use a calculator: write <calc>expression</calc> and you get <result>value</result>. "
              "Then give the final answer as <answer>number</answer>.")
    SHOT = [{"role": "user", "content": "What is 12 * 34?"}, {"role": "assistant", "content": "<calc>12 * 34</calc>"},
            {"role": "user", "content": "<result>408</result>"}, {"role": "assistant", "content": "<answer>408</answer>"}]

    class Options(Options):
        """``task.options`` of ``multiply``."""

        digits: int = Field(3, ge=1, le=18)
        """Digits of each factor."""
        eval_every: int = Field(10, ge=2, le=1_000_000)
        """One pair in this many (by a hash of it) is held out: the eval split."""

    def __init__(self, prompts: int, seed: int = 0, digits: int = 3, eval_prompts: int = 64, eval_every: int = 10):
        self.prompts, self.seed, self.digits = prompts, seed, digits
        self.eval_prompts, self.eval_every = eval_prompts, eval_every

    def _draw(self, rng: random.Random, held_out: bool) -> Prompt:
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits - 1
        while True:
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            if self._held_out(f"{a}*{b}") == held_out:
                text = f"What is {a} * {b}?"
                return Prompt(text, {"target": str(a * b)}, chat=True, system=self.SYSTEM,
                              messages=[{"role": "system", "content": self.SYSTEM}, *self.SHOT,
                                        {"role": "user", "content": text}])
