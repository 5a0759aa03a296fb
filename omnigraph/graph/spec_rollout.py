"""What a ``generate`` node may add to one completion per sample: multi-turn episodes (``env:``) and partial
rollouts (``partial:``); how backend ``hf`` decodes (``decode:``). Part of the schema in :mod:`omnigraph.graph.spec`.

>>> DecodeSpec.model_validate("eager")
DecodeSpec(mode='eager', prompt_len=64)
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


class DecodeSpec(Strict):
    """How backend ``hf`` decodes (``decode: eager`` is short for ``decode: {mode: eager}``)."""

    mode: Literal["auto", "static", "eager"] = "auto"
    """``static``: a static KV cache and a compiled decode step (a CUDA graph per token), compiled once when
    the node starts (30-50 s for a 0.5B model on an H200, in the start-up; needs CUDA); ``eager``:
    transformers' ``generate`` with its dynamic cache; ``auto``: static on CUDA, eager on the CPU."""
    prompt_len: int = Field(64, ge=1, le=131_072)
    """Static: the prompt length the start-up compile is sized for (rounded up to a power of two, at least 32).
    Shorter prompts reuse it; a longer one grows the cache to its power of two, which compiles once more."""

    @model_validator(mode="before")
    @classmethod
    def _mode_alone(cls, data: Any) -> Any:
        return {"mode": data} if isinstance(data, str) else data
