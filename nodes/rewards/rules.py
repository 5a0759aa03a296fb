r"""Rule-based rewards: plain functions ``(prompt, completion, **meta) -> float``.

A graph names one by dotted path (``fn: nodes.rewards.rules:digits_match``), so a
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
>>> exact_match("Capital of France?", " Paris ", target="Paris")
1.0
>>> math_verify("Half of one?", "The answer is \\boxed{\\frac{1}{2}}", target="0.5")
1.0
>>> math_verify("Half of one?", "It is 0.25.", target="1/2")
0.0
"""

from __future__ import annotations

import logging
import re
import threading

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


def exact_match(prompt: str, completion: str, *, target: str, **meta) -> float:
    """1.0 when the reply, stripped, is the target, else 0.0."""
    return float(completion.strip() == str(target).strip())


def math_verify(prompt: str, completion: str, *, target: str, **meta) -> float:
    """1.0 when the reply's answer equals the target mathematically, by `math-verify
    <https://pypi.org/project/math-verify/>`_: ``\\boxed{}`` first, else the last LaTeX or plain expression;
    ``1/2``, ``0.5`` and ``\\frac{1}{2}`` are the same answer. The target may be LaTeX or plain.

    math-verify bounds its own time with ``SIGALRM``, which works only on the main thread; a node called on
    another thread (Ray's) runs it unbounded (sympy on one short answer)."""
    import math_verify as mv                  # heavy (sympy, antlr): only graphs that score math pay for it
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_text = str(target)
    if "$" not in gold_text and "\\boxed" not in gold_text:
        gold_text = f"${gold_text}$"
    gold = mv.parse(gold_text, parsing_timeout=timeout)
    answer = mv.parse(completion, parsing_timeout=timeout)
    if not gold or not answer:
        return 0.0
    return float(mv.verify(gold, answer, timeout_seconds=timeout))


def env_reward(prompt: str, completion: str, *, episode: dict | None = None, **meta) -> float:
    """The episode's reward from its environment (multi-turn rollouts, ``generate: {env: ...}``), or what an
    agent run returned (``generate: {agent: ...}``)."""
    if episode is None:
        raise ValueError("reward env scores multi-turn episodes and agent runs: the generate node has neither")
    return float(episode["reward"])
