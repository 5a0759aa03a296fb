"""A tool-calling agent written against the plain ``openai`` client: it offers the model a calculator through
the OpenAI ``tools`` API, runs the calls the model makes, and scores the final answer.

Trained by omnigraph as it is (``graphs/smollm2_agent.yaml``)::

    generate:
      agent: {entry: ../examples/agents/calculator.py:solve, options: {max_turns: 3}}

omnigraph serves the policy behind an OpenAI-compatible endpoint and hands this function a client pointed
at it and the data row (``task``: ``prompt``, ``messages``, ``target``, ...). The same function runs against
any OpenAI-compatible server, e.g. to evaluate the trained model behind vLLM's own.

>>> import asyncio
>>> calculator({"expression": "253 * 667"})
'168751'
>>> final_answer("so it is <answer>168751</answer>"), final_answer("I think 12")
('168751', '12')
"""

from __future__ import annotations

import ast
import json
import operator
import re

import openai

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression (numbers, + - * / and parentheses).",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
SYSTEM = ('Use the calculator tool: <tool_call>{"name": "calculator", "arguments": {"expression": "..."}}'
          '</tool_call>. Then answer <answer>number</answer>.')


def shot(a: int, b: int, i: int) -> list[dict]:
    """A worked question: the call, the tool's result, the answer (three of them show a small model the
    format; with one, SmolLM2-135M calls the tool in about one reply of sixteen)."""
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": f"{a} * {b}"})}}
    return [{"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": str(a * b)},
            {"role": "assistant", "content": f"<answer>{a * b}</answer>"}]


SHOTS = [*shot(12, 34, 0), *shot(56, 78, 1), *shot(91, 23, 2)]
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
CALC = re.compile(r"<calc>(.*?)</calc>", re.S)
ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def calculator(arguments: dict) -> str:
    """The tool: the value of ``arguments["expression"]``, or an error message the model reads."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and abs(node.value) < 1e12:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("unsupported expression")
    expression = str(arguments.get("expression", "")).strip()
    try:
        if len(expression) > 200:
            raise ValueError("too long")
        x = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return "error: unsupported expression"
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def final_answer(text: str) -> str:
    tagged = ANSWER.search(text or "")
    numbers = NUMBER.findall(tagged.group(1) if tagged else (text or ""))
    return numbers[-1] if numbers else ""


async def solve(client: openai.AsyncOpenAI, task: dict, max_turns: int = 3, model: str = "policy") -> dict:
    """One episode: the question, tool calls answered until the model replies without one; 1.0 when that
    reply's number is the task's ``target``."""
    messages = [{"role": "system", "content": SYSTEM}, *SHOTS, {"role": "user", "content": task["prompt"]}]
    calls = 0
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=48)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            answer = final_answer(message.content)
            return {"reward": float(answer == str(task["target"])), "tool_calls": calls, "answer": answer}
        for call in message.tool_calls:
            calls += 1
            try:
                arguments = json.loads(call.function.arguments)
            except ValueError:
                arguments = {}
            if not isinstance(arguments, dict):           # the model wrote a list or a number
                arguments = {}
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(arguments)})
    return {"reward": 0.0, "tool_calls": calls, "answer": ""}


async def tags(client: openai.AsyncOpenAI, task: dict, max_turns: int = 3, model: str = "policy") -> dict:
    """The ``calculator`` environment's own protocol as an agent program: the task's messages (which explain
    ``<calc>expression</calc>``), each call answered by a user turn ``<result>value</result>``, the reply without
    a call scored. It plays the episodes ``env: {name: calculator}`` plays, so ``bench/agent.py`` can time the
    endpoint against the built-in loop on the same work."""
    messages = list(task["messages"])
    calls = 0
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model=model, messages=messages)
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        call = CALC.search(text)
        if call is None:
            answer = final_answer(text)
            return {"reward": float(answer == str(task["target"]).strip()), "tool_calls": calls, "answer": answer}
        calls += 1
        messages.append({"role": "user", "content": f"<result>{calculator({'expression': call.group(1)})}</result>"})
    return {"reward": 0.0, "tool_calls": calls, "answer": ""}
