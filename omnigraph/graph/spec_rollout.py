"""What a ``generate`` node may add to one completion per sample: multi-turn episodes (``env:``), agent
programs served an OpenAI-compatible endpoint (``agent:``) and partial rollouts (``partial:``). Part of the schema in :mod:`omnigraph.graph.spec`. (How a backend decodes is its own
option: ``nodes.<generate>.options``, validated by the backend's options model.)

>>> PartialSpec.model_validate({"budget_tokens": 16, "max_spans": 3}).max_spans
3
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .spec_base import Seconds, Strict


class EnvSpec(Strict):
    """Multi-turn rollouts (:mod:`omnigraph.sdk.env`): the model and an environment take turns."""

    name: str
    """A registered environment (``omnigraph.environments``: ``copy_chain``, ``calculator``) or the dotted
    path ``module:Class`` of one."""
    max_turns: int = Field(4, ge=1, le=1_000)
    """Model turns per episode at most (``max_new_tokens`` is the cap of each)."""
    max_tokens: int = Field(256, ge=1, le=131_072)
    """Token budget of an episode after its prompt: the model's and the environment's tokens together."""
    waves: int = Field(2, ge=1, le=64)
    """The batch's episodes run in this many waves: while one wave's environment steps run, the next
    wave generates (1: every episode generates, then every environment answers)."""
    options: dict[str, Any] = {}
    """Keyword arguments of the environment (e.g. ``latency_s`` of a modelled slow tool)."""


class AgentSpec(Strict):
    """Agent programs as the rollout: each sample is one run of the user's agent,
    which talks to the policy through an OpenAI-compatible endpoint that the rollout serves; what the endpoint
    sampled, token for token, is what is trained."""

    entry: str | None = None
    """``module:function``: ``async def fn(client: openai.AsyncOpenAI, task: dict, **options) -> float | dict``
    (the reward, or a dict with ``reward`` and anything else to log); ``task`` is the data row."""
    command: list[str] | None = None
    """A program in any language or environment instead: it gets ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and
    ``OMNIGRAPH_AGENT_OPTIONS`` (JSON) in its environment and the task as JSON on stdin, and prints its
    result (a number, or JSON with ``reward``) as its last line of output."""
    options: dict[str, Any] = {}
    """Keyword arguments of ``entry`` (``OMNIGRAPH_AGENT_OPTIONS`` of ``command``)."""
    concurrency: int = Field(256, ge=1, le=4_096)
    """Agents running at once (each of a batch's samples is one agent run; at least the batch's samples, so
    that each turn of every agent is sampled in one batch)."""
    max_turns: int = Field(8, ge=1, le=1_000)
    """Requests one agent run may make; past it the endpoint answers with an error."""
    max_tokens: int = Field(512, ge=1, le=131_072)
    """Token budget of an episode after its first prompt: sampled tokens and what the agent added between
    requests (tool results, user turns) together; a request past it is answered with ``finish_reason:
    length`` and nothing sampled."""
    timeout_s: Seconds = Field(300.0, gt=0)
    """Seconds one agent run may take; then it is cancelled (a command's whole process group killed) and
    scored by ``on_timeout``."""
    on_timeout: Literal["zero", "drop"] = "zero"
    """An agent run that timed out or raised: ``zero`` trains what it sampled with reward 0; ``drop`` trains
    none of it (its tokens are masked out; it still counts in its group's mean)."""
    on_divergence: Literal["keep", "split"] = "keep"
    """A request whose history is not what was sampled (the agent edited it, or the template renders past turns
    otherwise): ``keep`` trains the episode as one sample, the tokens that were sampled followed by the new
    turns; ``split`` ends the episode's sample there and starts another from the request as sent, so every
    sample is a context the policy really sampled from (the samples of one episode share its advantage)."""
    host: str = "127.0.0.1"
    """Interface the endpoint binds (a free port, a random key per run); another only on purpose."""
    max_request_bytes: int = Field(1_000_000, ge=1_024, le=1_000_000_000)
    """Largest request body the endpoint reads."""
    max_n: int = Field(4, ge=1, le=64)
    """Largest ``n`` (choices per request) the endpoint samples."""
    batch_wait_s: float = Field(0.1, ge=0, le=10)
    """How long the endpoint waits for more requests before it samples the ones it has as one batch (it
    samples at once when every running agent is waiting for a reply)."""

    @model_validator(mode="after")
    def _one_program(self) -> "AgentSpec":
        if (self.entry is None) == (self.command is None):
            raise ValueError("agent needs exactly one of entry (module:function, run in the rollout's process) "
                             "and command (a program run once per sample)")
        if self.command is not None and not self.command:
            raise ValueError("agent.command is empty: give the program and its arguments, e.g. [python, agent.py]")
        return self


class PartialSpec(Strict):
    """Partial rollouts: a firing returns the prompt groups whose samples have all finished; the others stay
    in the rollout and continue in the next firing under whatever weights arrived (each token keeps the
    version that sampled it and its sampling logprob)."""

    budget_tokens: int | None = Field(None, ge=1, le=131_072)
    """New tokens per sample per firing (decode steps): reproducible, the same on every executor and on resume."""
    budget_s: Seconds | None = Field(None, gt=0)
    """Seconds of generation per firing: adapts to the machine, but which samples finish depends on timing."""
    max_spans: int = Field(2, ge=1, le=64)
    """Firings (so weight versions) one sample may span; in its last one a sample runs to its end. Adds
    ``max_spans - 1`` to the staleness bound, per sample and per token."""

    @model_validator(mode="after")
    def _one_budget(self) -> "PartialSpec":
        if (self.budget_tokens is None) == (self.budget_s is None):
            raise ValueError("partial needs exactly one of budget_tokens (new tokens per sample per firing) "
                             "and budget_s (seconds per firing)")
        return self


