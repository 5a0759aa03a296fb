"""Rollout backends (role generator): transformers (``hf``) and vLLM, partial rollouts and multi-turn episodes.

This module holds their descriptors, registered under ``omnigraph.backends`` in ``pyproject.toml`` exactly as a
user's package registers its own, and their options. It is light (no torch): the compiler reads it, and runs
each descriptor's ``check`` on a graph, before anything starts; each ``impl`` is imported only on the actors
that run the node.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from omnigraph.sdk import Backend, ConfigError, Options, load
from omnigraph.sdk.registry import load_dotted

WARM_MODEL = "nodes.models:warm"
"""Warm workers import the model's architecture code with the backend's module (``Backend.warm``)."""


class Decode(Options):
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


class HfOptions(Options):
    """Options of backend ``hf`` (``nodes.<generate>.options``)."""

    decode: Decode = Decode()
    """Static KV cache and compiled decode step, or eager ``generate`` (``auto``: static on CUDA)."""


class VllmOptions(Options):
    """Options of backend ``vllm`` (``nodes.<generate>.options``)."""

    lora_serving: Literal["adapter", "merged"] = "adapter"
    """With LoRA weights: serve the adapter (a new ``LoRARequest`` per version), or merge it into the base
    weights on the rollout and reload those (``merged``: base-model speed, still only adapter bytes on the wire;
    vLLM's LoRA kernels are slow on CPU)."""
    packed_weights: bool = False
    """On a CPU with AMX, for 16-bit weights: compute the linear layers from sgl-kernel buffers omnigraph refills
    in place at each load (``nodes.rollout.vllm_weights``), a faster sync. Off by default: with it on, a bf16
    SmolLM2 run on an AMX CPU collapsed while the sampler's log-probs of its own tokens drifted 3-13 nats from
    the trainer's, a fault not yet found."""


def typed(model: type[Options], options) -> Options | None:
    """The node's backend options, or None where they do not validate (the compiler reports that itself)."""
    try:
        return model.model_validate(options.options)
    except ValidationError:
        return None


def _episodes(node, options, spec) -> list:
    """``env:`` names an environment that loads (a token generator runs it: hf, vllm)."""
    if options.env is None:
        return []
    try:
        load("environments", options.env.name)
    except LookupError as e:
        return [ConfigError(str(e), where=f"nodes.{node}.env.name",
                            fix="name a registered environment (omnigraph.environments) or module:Class")]
    return []


def _not_partial_episodes(node, options, spec) -> list:
    if options.env is not None and options.partial is not None:
        return [ConfigError("partial rollouts continue single-turn completions; a multi-turn episode runs whole "
                            "within one firing (its waves already hide the environment's latency)",
                            where=f"nodes.{node}.partial", fix="remove partial, or remove env")]
    return []


def _agent(node, options, spec) -> list:
    """``agent:`` names a program that loads, and runs alone: not with ``env`` (the agent is the environment)."""
    agent = getattr(options, "agent", None)
    if agent is None:
        return []
    out = []
    if options.env is not None:
        out.append(ConfigError("an agent drives its own turns: it replaces env (write the environment's logic in "
                               "the agent)", where=f"nodes.{node}.agent", fix="remove env, or remove agent"))
    if agent.entry is not None:
        try:
            load_dotted(agent.entry)
        except LookupError as e:
            out.append(ConfigError(f"cannot load the agent '{agent.entry}': {e}", where=f"nodes.{node}.agent.entry",
                                   fix="give module:function of an async function (the module importable where "
                                       "omnigraph runs: installed, or on PYTHONPATH)"))
    return out


def _static_decode(node, options, spec) -> list:
    """``decode: static`` compiles a CUDA graph per token: it needs a pool with GPUs."""
    pool, opts = spec.pools.get(options.pool), typed(HfOptions, options)
    if opts is not None and opts.decode.mode == "static" and pool is not None and pool.gpus <= 0:
        return [ConfigError(f"decode: static compiles the decode step for CUDA, but pool '{options.pool}' has no GPU",
                            where=f"nodes.{node}.options.decode", fix="use decode: auto (static on CUDA, eager on the "
                                                                      f"CPU) or eager, or give pools.{options.pool} gpus")]
    return []


def _hf(node, options, spec) -> list:
    return (_episodes(node, options, spec) + _not_partial_episodes(node, options, spec) + _agent(node, options, spec)
            + _static_decode(node, options, spec))


def _vllm(node, options, spec) -> list:
    return _episodes(node, options, spec) + _not_partial_episodes(node, options, spec) + _agent(node, options, spec)


GENERATE_HF = Backend("generate", "nodes.rollout.hf:Generate", uses_model=True, partial=True, options=HfOptions,
                      capabilities=frozenset({"lend", "weight_targets", "agents"}), check=_hf, warm=WARM_MODEL,
                      doc="transformers generate: batched sampling with per-token logprobs")
GENERATE_VLLM = Backend("generate", "nodes.rollout.vllm_engine:VllmGenerate", uses_model=True, partial=True,
                        options=VllmOptions, check=_vllm, warm=False, capabilities=frozenset({"agents"}),   # vLLM binds OpenMP to its cores: torch after
                        doc="a vLLM engine in the rollout actor, weights loaded in place (extra: vllm)")
