"""Environments for multi-turn rollouts: the model acts, the environment answers, the model acts again.

A generate node with ``env: {name: ...}`` runs *episodes* instead of single completions. For each prompt
the rollout makes one environment per sample (``cls(prompt, **env.options)``), then turn after turn:
the model writes a message, the rollout hands it to :meth:`Environment.step`, and the step's
``observation`` is appended to the conversation (through the model's chat template for chat prompts,
as plain text otherwise) before the model's next turn. An episode ends when a step says ``done``, after
``env.max_turns`` model turns, or when its token budget (``env.max_tokens`` after the prompt, the
model's and the environment's tokens together) is spent. Only the model's tokens are trained: the
environment's are in the sequence the trainer reads but masked out of the loss.

``step`` (and ``reset``) may be ``async``: the steps of one batch's episodes run concurrently on an event
loop, and while one wave of episodes waits for its environment the rollout generates the next wave's
turn, so a slow tool (a sandbox, an HTTP call) is hidden behind generation. A plain function works too
(it runs in a worker thread).

An environment is registered like every plugin::

    [project.entry-points."omnigraph.environments"]
    calculator = "my_pkg.envs:Calculator"

>>> import asyncio
>>> class Echo(Environment):
...     async def step(self, message):
...         return EnvStep(observation=None, reward=float(message == self.prompt.meta["target"]), done=True)
>>> asyncio.run(Echo(Prompt("say 7", {"target": "7"})).step("7"))
EnvStep(observation=None, reward=1.0, done=True, tool_calls=0, info={}, images=[])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Protocol, runtime_checkable

from .data import Prompt


@dataclass
class EnvStep:
    """What the environment answers to one model message."""

    observation: str | None = None
    """Text to show the model before its next turn (``None``: nothing, e.g. when ``done``)."""
    reward: float = 0.0
    """Reward for this step; an episode's reward is the sum of its steps' (``episode["reward"]``)."""
    done: bool = False
    tool_calls: int = 0
    """Tool calls this step made (counted in the metrics: ``tool_calls_per_episode``)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything else, kept in the episode's record (``episode["info"]``, the last step's wins per key)."""
    images: list[bytes] = field(default_factory=list)
    """Pictures shown with the observation (encoded files: PNG, JPEG, ...), for an image-text policy: each where
    the observation's text says ``<image>``, else all before the text (in a chat, as image parts of the
    environment's message)."""


@runtime_checkable
class EnvironmentLike(Protocol):
    """What the rollout calls; :class:`Environment` is a convenient base."""

    def step(self, message: str) -> EnvStep | Awaitable[EnvStep]: ...


class Environment:
    """One episode's environment: built with the prompt that starts the episode and ``env.options``.

    ``reset()`` runs once before the model's first turn (start a sandbox, open a session); ``step(message)``
    gets each model message (the decoded text of its turn, special tokens left out) and answers."""

    role = "user"
    """The chat role of the observations (``user``; ``tool`` where the model's chat template has it)."""

    def __init__(self, prompt: Prompt, **options: Any):
        self.prompt = prompt
        self.options = options

    async def reset(self) -> None:
        return None

    async def step(self, message: str) -> EnvStep:
        raise NotImplementedError
