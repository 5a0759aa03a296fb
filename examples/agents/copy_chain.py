"""The ``copy_chain`` environment (``nodes/envs/simple.py``) written as an agent program over the completions
endpoint: the prompt grows by each reply and by the next number to copy, exactly as the environment grows the
episode, so the two give the same samples token for token (``tests/test_agents.py``; ``bench/agent.py`` times
them side by side).

    generate:
      agent: {entry: ../examples/agents/copy_chain.py:solve, options: {rounds: 3}, max_tokens: 40}

``edited`` is the same agent with one habit of real ones: it tidies the model's reply (strips its spaces)
before it sends the conversation back, so its history is not what was sampled and the endpoint counts a
divergence (``retokenize_mismatch``).
"""

from __future__ import annotations

import random
import zlib

import openai


def digits_match(completion: str, target: str) -> float:
    """The environment's score: the fraction of the target's digits the reply's first word has in place."""
    words = completion.split()
    answer = words[0] if words else ""
    return sum(a == b for a, b in zip(answer, target)) / max(len(answer), len(target), 1)


async def solve(client: openai.AsyncOpenAI, task: dict, rounds: int = 3, tidy: bool = False) -> float:
    target, text, reward = task["target"], task["prompt"], 0.0
    rng = random.Random(zlib.crc32(task["prompt"].encode()))
    for asked in range(1, rounds + 1):
        out = await client.completions.create(model="policy", prompt=text)
        reply = out.choices[0].text
        reward += digits_match(reply, target) / rounds
        if asked == rounds:
            break
        target = str(rng.randint(10 ** (len(target) - 1), 10 ** len(target) - 1))
        text += (reply.strip() if tidy else reply) + f"copy {target}:"
    return reward


async def edited(client: openai.AsyncOpenAI, task: dict, rounds: int = 3) -> float:
    return await solve(client, task, rounds, tidy=True)
