"""omnigraph's own environments for multi-turn rollouts (registered under ``omnigraph.environments``).

``copy_chain`` (for the tiny model): the prompt shows a number to copy; after each reply the environment
scores the copy (:func:`nodes.rewards.rules.digits_match`, shared over the rounds) and shows the next number,
``copy 5183:``, until ``rounds`` numbers were asked. A reply to a later number only scores if the model
reads the environment's message, so the task needs every turn.

``calculator`` (for an instruct model): a tool. A reply with ``<calc>EXPRESSION</calc>`` gets
``<result>VALUE</result>`` back (arithmetic only: numbers, ``+ - * / ( )``); a reply without a call is
the final answer, ``<answer>N</answer>`` (or the last number in the reply), rewarded 1.0 when it is
the prompt's ``target``. Multiplying two 3-digit numbers is beyond SmolLM2-135M alone; calling the tool
and copying its result is not.

Both take ``latency_s``: each step waits that long first (``asyncio.sleep``), a modelled slow tool.

>>> import asyncio
>>> from omnigraph.sdk import Prompt
>>> calc = Calculator(Prompt("What is 123 * 456?", {"target": "56088"}))
>>> asyncio.run(calc.step("<calc>123 * 456</calc>")).observation
'<result>56088</result>'
>>> asyncio.run(calc.step("The answer is <answer>56088</answer>")).reward
1.0
>>> evaluate("2 ** 99999")
Traceback (most recent call last):
...
ValueError: unsupported expression
"""

from __future__ import annotations

import ast
import asyncio
import operator
import random
import re
import zlib

from pydantic import Field

from omnigraph.sdk import EnvStep, Environment, Options, Prompt

from nodes.rewards.rules import digits_match

CALL = re.compile(r"<calc>(.*?)</calc>", re.S)
ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression (numbers, + - * / and parentheses); ValueError otherwise."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and abs(node.value) < 1e12:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("unsupported expression")
    if len(expression) > 200:
        raise ValueError("unsupported expression")
    try:
        return value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError, RecursionError):
        raise ValueError("unsupported expression") from None


def _show(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


class CopyChain(Environment):
    class Options(Options):
        """``env.options`` of ``copy_chain``."""

        rounds: int = Field(2, ge=1, le=1000)
        """Numbers to copy per episode: after each answer the environment asks for a new one."""
        latency_s: float = Field(0.0, ge=0, le=3600)
        """Seconds each environment step waits first (a modelled slow tool)."""

    def __init__(self, prompt: Prompt, rounds: int = 2, latency_s: float = 0.0):
        super().__init__(prompt)
        self.target, self.rounds, self.latency_s = prompt.meta["target"], rounds, latency_s
        self.asked = 1
        self.rng = random.Random(zlib.crc32(prompt.text.encode()))

    async def step(self, message: str) -> EnvStep:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        score = digits_match("", message, target=self.target) / self.rounds
        if self.asked >= self.rounds:
            return EnvStep(reward=score, done=True)
        self.asked += 1
        self.target = str(self.rng.randint(10 ** (len(self.target) - 1), 10 ** len(self.target) - 1))
        return EnvStep(observation=f"copy {self.target}:", reward=score)


class Calculator(Environment):
    role = "user"

    class Options(Options):
        """``env.options`` of ``calculator``."""

        latency_s: float = Field(0.0, ge=0, le=3600)
        """Seconds each environment step waits first (a modelled slow tool)."""

    def __init__(self, prompt: Prompt, latency_s: float = 0.0):
        super().__init__(prompt)
        self.target, self.latency_s = str(prompt.meta["target"]).strip(), latency_s

    async def step(self, message: str) -> EnvStep:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        call = CALL.search(message)
        if call:
            try:
                result = _show(evaluate(call.group(1)))
            except ValueError as e:
                result = f"error: {e}"
            return EnvStep(observation=f"<result>{result}</result>", tool_calls=1)
        tagged = ANSWER.search(message)
        numbers = NUMBER.findall(tagged.group(1) if tagged else message)
        answer = numbers[-1] if numbers else ""
        return EnvStep(reward=float(answer == self.target), done=True, info={"answer": answer})
