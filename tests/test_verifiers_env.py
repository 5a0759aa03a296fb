"""VerifiersEnv (nodes.envs.verifiers_adapter): real verifiers environments, built here from verifiers' own classes,
played through ``step`` with scripted model messages (no model, no network)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading

import pytest

pytest.importorskip("verifiers")

from omnigraph.sdk import ConfigError, Prompt  # noqa: E402

from nodes.envs.verifiers_adapter import VerifiersEnv, verifiers  # noqa: E402

try:
    vf = verifiers()
except ConfigError as e:          # verifiers 0.4: no classic stack
    pytest.skip(str(e), allow_module_level=True)
datasets = pytest.importorskip("datasets")

HERE = __name__
WHERE = "nodes.<generate>.env.options.env"


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def broken(x: int) -> int:
    """Always fails."""
    raise ValueError("the tool broke")


def correct(parser, completion, answer) -> float:
    return float((parser.parse_answer(completion) or "").strip().endswith(answer))


def dataset():
    return datasets.Dataset.from_list([{"question": "What is 2 + 3?", "answer": "5"}])


def tool_env(max_turns: int = 4, stop_on_error: bool = False):
    return vf.ToolEnv(tools=[add, broken], dataset=dataset(), rubric=vf.Rubric(funcs=[correct]), max_turns=max_turns,
                      stop_errors=[ValueError] if stop_on_error else None)


class Guess(vf.MultiTurnEnv):
    """Guess the number: a plain-function env_response answers with raw dicts, higher or lower."""

    async def setup_state(self, state):
        state["secret"] = int(state["answer"])

    def env_response(self, messages, state):
        hint = "higher" if int(messages[-1].content) < state["secret"] else "lower"
        return [{"role": "user", "content": hint}]

    @vf.stop
    async def guessed(self, state) -> bool:
        return bool(state["trajectory"]) and state["trajectory"][-1]["completion"][-1].content == state["answer"]


def guess_env(max_turns: int = 4):
    return Guess(dataset=dataset(), rubric=vf.Rubric(funcs=[correct]), max_turns=max_turns)


class Vault(vf.StatefulToolEnv):
    """The tool's ``secret`` argument is hidden from the model and injected from the state."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_tool(self.open_vault, args_to_skip=["secret"])

    @staticmethod
    def open_vault(code: int, secret: int) -> str:
        """Try a code."""
        return "open" if code == secret else "locked"

    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs):
        return {**tool_args, "secret": int(state["answer"])}


def vault_env():
    return Vault(dataset=dataset(), rubric=vf.Rubric(funcs=[correct]), max_turns=4)


def play(env: VerifiersEnv, messages: list[str]):
    async def run():
        await env.reset()
        return [await env.step(m) for m in messages]
    return asyncio.run(run())


def episode(factory: str, target: str = "5", **env_args) -> VerifiersEnv:
    return VerifiersEnv(Prompt("What is 2 + 3?", {"target": target}), env=f"{HERE}:{factory}", env_args=env_args)


def test_a_tool_call_is_answered_by_the_tool_then_the_answer_is_scored():
    first, last = play(episode("tool_env"), [f"Let me add. {call('add', a=2, b=3)}", "The answer is 5"])
    assert (first.observation, first.done, first.tool_calls, first.reward) == ("5", False, 1, 0.0)
    assert (last.observation, last.done, last.tool_calls, last.reward) == (None, True, 0, 1.0)
    assert last.info["stop_condition"] == "no_tools_called"
    assert last.info["metrics"]["total_tool_calls"] == 1.0 and last.info["metrics"]["correct"] == 1.0


def test_a_wrong_answer_scores_zero():
    (step,) = play(episode("tool_env"), ["The answer is 6"])
    assert step.done and step.reward == 0.0


def test_several_calls_in_one_message_join_their_results():
    env = episode("tool_env")
    (step,) = play(env, [call("add", a=2, b=3) + call("add", a=3, b=4)])
    assert (step.observation, step.tool_calls, step.done) == ("5\n7", 2, False)
    assert [m.role for m in env.messages[-2:]] == ["tool", "tool"] and env.role == "tool"


def test_a_bad_call_gets_the_error_back_from_the_tool():
    (unknown, garbled, failing) = play(episode("tool_env"),
                                        [call("subtract", a=1, b=2), "<tool_call>add(2, 3)</tool_call>",
                                         call("broken", x=1)])
    assert unknown.tool_calls == garbled.tool_calls == failing.tool_calls == 1
    assert "subtract" in unknown.observation and failing.observation == "the tool broke"
    assert not (unknown.done or garbled.done or failing.done)


def test_a_stop_error_ends_the_episode_unrewarded():
    (step,) = play(episode("tool_env", stop_on_error=True), [call("broken", x=1)])
    assert step.done and step.reward == 0.0 and step.info["stop_condition"] == "has_error"
    assert "ToolCallError" in step.info["error"]


def test_the_envs_max_turns_ends_the_episode_and_it_is_scored():
    steps = play(episode("tool_env", max_turns=2), [call("add", a=2, b=3), call("add", a=1, b=1)])
    assert [s.done for s in steps] == [False, True] and steps[-1].info["stop_condition"] == "max_turns_reached"
    assert steps[-1].reward == 0.0


def test_a_multiturn_env_with_a_plain_env_response_and_a_stop_condition():
    steps = play(episode("guess_env", target="7"), ["3", "9", "7"])
    assert [(s.observation, s.done) for s in steps] == [("higher", False), ("lower", False), (None, True)]
    assert steps[-1].reward == 1.0 and steps[-1].info["stop_condition"] == "guessed"
    assert sum(s.tool_calls for s in steps) == 0


def test_a_stateful_tool_env_gets_its_hidden_argument_from_the_state():
    steps = play(episode("vault_env", target="42"), [call("open_vault", code=41), call("open_vault", code=42),
                                                     "The code is 42"])
    assert [(s.observation, s.tool_calls) for s in steps] == [("locked", 1), ("open", 1), (None, 0)]
    assert steps[-1].done and steps[-1].reward == 1.0


def test_a_conversation_prompt_is_the_rollouts_prompt():
    prompt = Prompt("What is 2 + 3?", {"target": "5"}, chat=True, messages=[
        {"role": "system", "content": "Use the add tool."}, {"role": "user", "content": "What is 2 + 3?"}])
    env = VerifiersEnv(prompt, env=f"{HERE}:tool_env")
    (step,) = play(env, ["5"])
    assert [m.role for m in env.state["prompt"]] == ["system", "user"] and env.state["answer"] == "5"
    assert step.reward == 1.0 and env.state["info"] == {"target": "5"}


def test_the_environment_is_built_once_per_id_and_args():
    a, b, c = episode("tool_env"), episode("tool_env"), episode("tool_env", max_turns=3)
    assert a.env is b.env and a.env is not c.env and c.env.max_turns == 3


def test_it_builds_off_the_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(episode("tool_env", max_turns=5)))
    t.start()
    t.join()
    assert out and out[0].env.max_turns == 5
    assert play(out[0], ["5"])[0].reward == 1.0


@pytest.mark.parametrize("env, message", [(None, "no verifiers environment named"),
                                          ("no-such-verifiers-env", "cannot load the verifiers environment"),
                                          (f"{HERE}:nothing_here", "has no attribute"),
                                          (f"{HERE}:dataset", "not a verifiers MultiTurnEnv")])
def test_a_bad_env_names_the_field_and_the_fix(env, message):
    with pytest.raises(ConfigError, match=message) as e:
        VerifiersEnv(Prompt("x", {"target": "1"}), env=env)
    assert e.value.where == WHERE and e.value.fix


def test_without_verifiers_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ConfigError, match="not installed") as e:
        VerifiersEnv(Prompt("x", {"target": "1"}), env="anything")
    assert e.value.where == WHERE and "pip install" in e.value.fix
