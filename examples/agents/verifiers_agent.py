"""A command agent that plays one task of a `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ 0.4
environment (its ``verifiers.v1`` stack) through verifiers' own machinery: env, episode, rollout,
interception, trace and reward.

It runs in a virtualenv of its own, where nothing of omnigraph is importable::

    python3.11 -m venv /opt/vf && /opt/vf/bin/pip install verifiers==0.4.0
    generate: {agent: {command: [/opt/vf/bin/python, examples/agents/verifiers_agent.py]}}

omnigraph runs it once per sample, with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (the policy, served as the
model ``policy``) and ``OMNIGRAPH_AGENT_OPTIONS`` (``max_tokens``, default 48; ``max_turns``, default 3) in its
environment and the task (the data row: ``prompt``, ``target``, ...) as JSON on stdin; the last line it
prints is its result, ``{"reward": ..., "turns": ..., ...}``.

The environment is built in code, the way a v1 environment package is: a ``Taskset`` (here one task, the row)
of ``MathTask`` whose ``@vf.reward`` is 1.0 when the final answer (``<answer>N</answer>``, else the last
number) is the row's ``target``, bundled with its harness, ``CalculatorHarness``: the agent loop, offering the
model the calculator of ``calculator.py`` (beside this file) through the OpenAI ``tools`` API. verifiers puts
its interception server between the loop and the endpoint, so every turn lands on the trace, capped by the
agent's ``max_turns`` and with ``max_tokens`` imposed. The loop runs in this process, with no network but
the endpoint: verifiers' own harnesses (``null``, ``bash``) fetch ``uv`` and packages from PyPI at run time,
and a v1 task's tools are MCP servers (``vf.Toolset``) of their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import verifiers.v1 as vf
from openai import AsyncOpenAI

from calculator import SYSTEM, TOOLS, calculator, final_answer  # beside this file

NAME = Path(__file__).stem  # the plugin id: verifiers finds tasksets and harnesses by module name
sys.modules.setdefault(NAME, sys.modules[__name__])
__all__ = ["MathTaskset", "CalculatorHarness"]


class MathData(vf.TaskData):
    target: str


class MathTask(vf.Task[MathData]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(final_answer(trace.last_reply) == self.data.target)


class MathConfig(vf.TasksetConfig):
    row: dict = {}
    """The data row this taskset is made of."""


class MathTaskset(vf.Taskset[MathTask, MathConfig]):
    def load(self):
        row = self.config.row
        prompt = row.get("prompt") or row["messages"][-1]["content"]
        yield MathTask(MathData(prompt=prompt, system_prompt=SYSTEM, target=str(row["target"]).strip()),
                       self.config.task)


class CalculatorHarness(vf.Harness[vf.HarnessConfig]):
    """Chat with tools until a reply without a tool call; the model calls go through ``endpoint``."""
    APPENDS_SYSTEM_PROMPT, EXECUTES_CODE, NEEDS_CONTAINER = True, False, False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> vf.ProgramResult:
        system, prompt = self.resolve_text_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            while True:  # ended by a reply without a call, or by the interception refusing a turn past max_turns
                message = (await client.chat.completions.create(model=ctx.model, messages=messages, tools=TOOLS)
                           ).choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    return vf.ProgramResult(exit_code=0, stdout="", stderr="")
                for call in message.tool_calls:
                    try:
                        arguments = json.loads(call.function.arguments or "{}")
                    except ValueError:
                        arguments = {}
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": calculator(arguments if isinstance(arguments, dict) else {})})


async def play(row: dict, options: dict) -> dict:
    env = vf.load_environment(vf.SingleAgentEnvConfig(
        taskset={"id": NAME, "row": row},
        agent={"runtime": {"type": "subprocess"}, "max_turns": options.get("max_turns", 3)}))
    ctx = vf.ModelContext(model="policy",
                          client=vf.EvalClientConfig(base_url=os.environ["OPENAI_BASE_URL"],
                                                     api_key_var="OPENAI_API_KEY"),
                          sampling=vf.SamplingConfig(max_tokens=options.get("max_tokens", 48)))
    async with env.serving():
        episode = await env.run_episode(next(iter(env.taskset)), ctx)
    if not episode.traces:  # the episode failed before its agent ran
        return {"reward": 0.0, "errors": [e.message for e in episode.errors]}
    trace = episode.traces[-1]
    return {"reward": trace.reward, "turns": trace.num_turns, "tool_calls": len(trace.tool_messages),
            "answer": final_answer(trace.last_reply), "stop": trace.stop_condition,
            "errors": [e.message for e in [*episode.errors, *trace.errors]]}


def main() -> None:
    row = json.load(sys.stdin)
    options = json.loads(os.environ.get("OMNIGRAPH_AGENT_OPTIONS") or "{}")
    result = asyncio.run(play(row, options))
    print(json.dumps(result))
    if result["errors"]:  # a failed rollout (endpoint down, ...) is an error for omnigraph, not a reward of 0
        sys.exit("verifiers rollout failed: " + "; ".join(result["errors"]))


if __name__ == "__main__":
    main()
