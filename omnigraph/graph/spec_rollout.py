"""What a ``generate`` node may add to one completion per sample: multi-turn episodes (``env:``) and partial
rollouts (``partial:``). Part of the schema in :mod:`omnigraph.graph.spec`. (How a backend decodes is its own
option: ``nodes.<generate>.options``, validated by the backend's options model.)

>>> PartialSpec.model_validate({"budget_tokens": 16, "max_spans": 3}).max_spans
3
"""

from __future__ import annotations

from typing import Any

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


