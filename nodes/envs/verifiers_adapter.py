"""An environment of the ``verifiers`` library run unchanged as an omnigraph environment.

``verifiers``' classic stack (``MultiTurnEnv`` and its ``SingleTurnEnv``, ``ToolEnv``, ``StatefulToolEnv``;
verifiers 0.2 and 0.3, where 0.3 keeps it in ``verifiers.legacy``; 0.4 ships only ``verifiers.v1``)::

    env: {name: "nodes.envs.verifiers_adapter:VerifiersEnv", max_turns: 10,
          options: {env: my-env, env_args: {max_turns: 10}}}

``env`` is a ``verifiers.load_environment`` id (an installed environment package) or a dotted path
``package.module:attr`` (or ``package.module.attr``) to an environment, or to a class or function that
makes one (called with ``env_args``). It is built once per process. Each episode is one verifiers rollout
driven from outside: ``reset`` makes the rollout's state (``prompt``: the episode's messages, ``answer``:
``meta["target"]``, ``info``: ``meta``) and runs ``setup_state``; each ``step`` adds the model's message to
the trajectory and asks ``is_completed``; if the rollout goes on, the messages of ``env_response`` are the
observation (joined by newlines), and once it is complete the env's ``rubric`` scores it: that step is
``done`` with the rubric's reward. An episode omnigraph cuts first (``env.max_turns``, the token budget) is
not scored, so give the generate node at least the verifiers env's ``max_turns``.

Tool calls: verifiers takes them from an API response; here the model writes text, so for an environment
with tools a message's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (the Hermes
format of the Qwen and SmolLM3 chat templates) are its tool calls, and ``tool_calls`` counts the tool
messages ``env_response`` answers with. The task's prompt must show the tools (the env's ``tool_defs``).
The model is never called through verifiers: an environment that calls it itself (a simulated user) fails.

>>> parse_tool_calls('Adding. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
('Adding.', [('add', '{"a": 2, "b": 3}')])
>>> parse_tool_calls("<tool_call>add(2, 3)</tool_call>")      # not JSON: the tool answers with the error
('', [('', 'add(2, 3)')])
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import re
import signal
import threading
from typing import Any

from omnigraph.sdk import ConfigError, Environment, EnvStep, Options, Prompt, load
from omnigraph.sdk.adapters import verifiers as verifiers_internals

WHERE = "nodes.<generate>.env.options.env"
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_tool_calls(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The text outside ``<tool_call>`` blocks, and each block's tool name and JSON arguments."""
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            call = json.loads(block)
            args = call.get("arguments", {})
            calls.append((str(call.get("name", "")), args if isinstance(args, str) else json.dumps(args)))
        except (ValueError, AttributeError):
            calls.append(("", block))
    return TOOL_CALL.sub("", text).strip(), calls


def verifiers():
    """The module of verifiers' classic stack: ``verifiers.legacy`` (0.3), else ``verifiers`` (0.2)."""
    try:
        root = importlib.import_module("verifiers")
    except ImportError as e:
        raise ConfigError(f"the verifiers package is not installed ({e})", where=WHERE,
                          fix="pip install 'verifiers>=0.2,<0.4'") from None
    for name in ("verifiers.legacy", "verifiers"):
        try:
            vf = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(vf, "MultiTurnEnv"):
            return vf
    raise ConfigError(f"verifiers {getattr(root, '__version__', '?')} has no MultiTurnEnv (0.4 keeps only "
                      "verifiers.v1)", where=WHERE, fix="pip install 'verifiers>=0.2,<0.4'")


@contextlib.contextmanager
def _no_signal_handlers():
    """Within the block, ``signal.signal`` installs nothing (it returns the current handler, as if it had
    replaced it): the block runs off the main thread, where Python refuses to install handlers. The swap is
    process-wide; ``signal.signal`` itself is back when the block ends."""
    install = signal.signal
    signal.signal = lambda sig, handler: signal.getsignal(sig)
    try:
        yield
    finally:
        signal.signal = install


def _built_anywhere(make):
    """``make()``, also off the main thread: a verifiers environment installs SIGINT/SIGTERM handlers as it
    is built, which Python allows only in the main thread; elsewhere it goes without them."""
    if threading.current_thread() is threading.main_thread():
        return make()
    with _no_signal_handlers():
        return make()


@functools.lru_cache(maxsize=None)
def environment(ref: str, args: str = "{}"):
    """The verifiers environment ``ref`` built with the JSON ``args``, once per process."""
    vf, kwargs = verifiers(), json.loads(args)
    try:
        if ":" in ref or "." in ref:
            made = load("environments", ref if ":" in ref else ":".join(ref.rsplit(".", 1)))
            env = _built_anywhere(lambda: made(**kwargs)) if callable(made) and not isinstance(
                made, vf.Environment) else made
        else:
            env = _built_anywhere(lambda: vf.load_environment(ref, **kwargs))
    except Exception as e:  # noqa: BLE001 - whatever the environment's own code raises is the user's to fix
        raise ConfigError(f"cannot load the verifiers environment '{ref}': {type(e).__name__}: {e}", where=WHERE,
                          fix="name an installed verifiers environment (vf-install ID) or package.module:attr "
                              "giving one, with env_args its load_environment takes") from e
    if not isinstance(env, vf.MultiTurnEnv):
        raise ConfigError(f"'{ref}' gives a {type(env).__name__}, not a verifiers MultiTurnEnv", where=WHERE,
                          fix="point env at a MultiTurnEnv (SingleTurnEnv, ToolEnv, StatefulToolEnv, ...)")
    return env


@functools.lru_cache(maxsize=None)
def _no_client(vf):
    """A verifiers ``Client`` that refuses every call: omnigraph samples the model's turns itself."""
    def refuse(*args, **kwargs):
        raise RuntimeError("the model is sampled by omnigraph: a verifiers environment cannot call it")
    cls = type("OmnigraphSamples", (vf.Client,), {name: refuse for name in vf.Client.__abstractmethods__})
    return cls(None)


async def _maybe(value):
    return await value if inspect.isawaitable(value) else value


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = [p.get("text") if isinstance(p, dict) else getattr(p, "text", None) for p in content]
    return "".join(p for p in parts if p)


class VerifiersEnv(Environment):
    role = "user"

    class Options(Options):
        """``env.options`` of ``verifiers``."""

        env: str | None = None
        """A ``verifiers.load_environment`` id or ``package.module:attr`` of an environment."""
        env_args: dict[str, Any] = {}
        """Keyword arguments of the environment (plain values: numbers, strings, lists, mappings)."""

    def __init__(self, prompt: Prompt, env: str | None = None, env_args: dict[str, Any] | None = None):
        super().__init__(prompt, env=env, env_args=env_args)
        if not env:
            raise ConfigError("no verifiers environment named", where=WHERE,
                              fix="set env.options.env: a verifiers.load_environment id or package.module:attr")
        try:
            args = json.dumps(env_args or {}, sort_keys=True)
        except TypeError as e:
            raise ConfigError(f"env_args is not JSON: {e}", where="nodes.<generate>.env.options.env_args",
                              fix="give env_args as plain values (numbers, strings, lists, mappings)") from None
        self.vf = verifiers()
        self.env = environment(env, args)
        self.normalize = verifiers_internals.normalize_messages(self.vf)
        self.state = None
        self.messages: list = []          # the conversation so far, as verifiers messages

    async def reset(self) -> None:
        p = self.prompt
        prompt = [dict(m) for m in p.messages] if p.messages else (
            ([{"role": "system", "content": p.system}] if p.system else []) + [{"role": "user", "content": p.text}])
        target = p.meta.get("target")
        row = {"prompt": prompt, "example_id": p.group, "answer": "" if target is None else str(target),
               "info": dict(p.meta)}
        self.state = await _maybe(self.env.init_state(row, _no_client(self.vf), "omnigraph"))
        try:
            state = await _maybe(self.env.setup_state(self.state))
            self.state = self.state if state is None else state
        except self.vf.Error as e:        # as verifiers' rollout does: the has_error stop ends it
            self.state["error"] = e
        self.messages = list(self.state["prompt"])

    def _assistant(self, message: str):
        text, calls = parse_tool_calls(message) if self.state.get("tool_defs") else (message, [])
        turn = len(self.state["trajectory"])
        tool_calls = [self.vf.ToolCall(id=f"call_{turn}_{i}", name=name, arguments=args)
                      for i, (name, args) in enumerate(calls)]
        return self.vf.AssistantMessage(content=text, tool_calls=tool_calls or None)

    async def step(self, message: str) -> EnvStep:
        if self.state is None:
            await self.reset()
        env, state = self.env, self.state
        reply = self._assistant(message)
        await _maybe(env.add_trajectory_step(state, {
            "prompt": self.messages, "completion": [reply], "response": None, "tokens": None, "reward": None,
            "advantage": None, "is_truncated": False, "trajectory_id": state["trajectory_id"], "extras": {}}))
        self.messages = self.messages + [reply]
        if await _maybe(env.is_completed(state)):
            return await self._scored()
        try:
            answer = self.normalize(await _maybe(env.env_response(self.messages, state)) or [],
                                    field_name="env_response")
        except self.vf.Error as e:
            state["error"], answer = e, []
        self.messages = self.messages + answer
        tools = sum(m.role == "tool" for m in answer)
        if (state.get("final_env_response") is not None or state.get("error") is not None) \
                and await _maybe(env.is_completed(state)):
            return await self._scored(tools)
        if answer and answer[-1].role in ("tool", "user"):
            self.role = answer[-1].role   # for the record: the rollout renders observations in the class's role
        return EnvStep(observation="\n".join(_text(m.content) for m in answer) or None, tool_calls=tools)

    async def _scored(self, tool_calls: int = 0) -> EnvStep:
        """Finish the rollout as verifiers does: its cleanup (which renders ``completion``), the rubric, the
        rubric's cleanup."""
        env, state = self.env, self.state
        await _maybe(env.cleanup(state))
        rubric = env.rubric
        if not getattr(env, "score_rollouts", True):
            await _maybe(rubric.dummy_score_rollout(state))
        elif getattr(rubric, "has_group_rewards", False):       # a group of one: its own group
            await _maybe(rubric.score_group([state]))
        else:
            await _maybe(rubric.score_rollout(state))
        await _maybe(rubric.cleanup(state))
        info = {"stop_condition": state.get("stop_condition"), "metrics": dict(state.get("metrics") or {})}
        if state.get("error") is not None:
            info["error"] = repr(state["error"])
        return EnvStep(reward=float(state.get("reward") or 0.0), done=True, tool_calls=tool_calls, info=info)
