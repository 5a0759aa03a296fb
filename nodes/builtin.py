"""omnigraph's own backends, registered in its ``pyproject.toml`` exactly as a user's package registers its
own (entry-point group ``omnigraph.backends``, names ``<kind>.<backend>``).

This module is light (no torch): the compiler reads these descriptors, and runs their ``check`` on a
graph, before anything starts; each ``impl`` is imported only on the actors that run the node.
"""

from __future__ import annotations

from omnigraph.sdk import Backend, ConfigError, load


def _not_merged(node, options, spec) -> list:
    if options.lora_serving == "merged":
        return [ConfigError(f"lora_serving: merged is a vllm backend option (this node uses backend "
                            f"{options.backend})", where=f"nodes.{node}.lora_serving", fix="remove it, or set backend: vllm")]
    return []


def _reward_function(node, options, spec) -> list:
    try:
        load("rewards", options.fn)
    except LookupError as e:
        return [ConfigError(str(e), where=f"nodes.{node}.fn",
                            fix="name a registered reward (omnigraph.rewards) or module:function")]
    return []


def _torch_trainer(node, options, spec) -> list:
    out = []
    pool = spec.pools[options.pool]
    if spec.model.dtype == "float16":
        out.append(ConfigError("float16 training needs a gradient scaler, which the torch trainer does not use "
                               "(small gradients underflow to zero)", where="model.dtype",
                               fix="use bfloat16 (mixed precision: fp32 master weights, bf16 compute) or float32; "
                                   "float16 rollouts alone: nodes.<generate>.dtype: float16"))
    if pool.actors > 1 and 0 < pool.gpus < 1:
        out.append(ConfigError(f"data-parallel training over {pool.actors} trainer actors with {pool.gpus:g} GPU "
                               "each: NCCL needs each rank on a GPU of its own", where=f"pools.{options.pool}.gpus",
                               fix=f"set pools.{options.pool}.gpus: 1, or pools.{options.pool}.actors: 1"))
    if pool.actors > 1 and spec.runtime.executor == "local":
        out.append(ConfigError(f"data-parallel training over {pool.actors} trainer actors needs one process per "
                               "actor", where="runtime.executor",
                               fix=f"use the ray or ray-tasks executor, or pools.{options.pool}.actors: 1"))
    return out


def _torch_sync(node, options, spec) -> list:
    lora = any(n.kind == "update" and getattr(n, "lora", None) for n in spec.nodes.values())
    if options.payload == "lora" and not lora:
        return [ConfigError("payload lora but the update node trains no LoRA adapters", where=f"nodes.{node}.payload",
                            fix="set payload: full, or give the update node lora: {r: 8}")]
    if options.payload == "full" and lora:
        return [ConfigError("the update node trains LoRA adapters: send them, not the full weights",
                            where=f"nodes.{node}.payload", fix="set payload: lora")]
    return []


GENERATE_HF = Backend("generate", "nodes.hf:Generate", uses_model=True, check=_not_merged,
                      doc="transformers generate: batched sampling with per-token logprobs")
GENERATE_VLLM = Backend("generate", "nodes.vllm_backend:VllmGenerate", uses_model=True,
                        doc="a vLLM engine in the rollout actor, weights loaded in place (extra: vllm)")
GENERATE_SYNTHETIC = Backend("generate", "nodes.synthetic:Generate", check=_not_merged,
                             doc="stand-in work of `cost` seconds")

REWARD_PYTHON = Backend("reward", "nodes.scorer:Reward", check=_reward_function,
                        doc="a reward function per sample, GRPO advantages")
REWARD_SYNTHETIC = Backend("reward", "nodes.scorer:Reward", doc="exact match, no function")

OLD_LOGPROB_TORCH = Backend("old_logprob", "nodes.logprob:Logprob", uses_model=True,
                            doc="the trainer's current weights (fused into a one-step update)")
REF_LOGPROB_TORCH = Backend("ref_logprob", "nodes.logprob:Logprob", uses_model=True, doc="the initial weights")
LOGPROB_SYNTHETIC = Backend("old_logprob", "nodes.synthetic:Logprob", doc="deterministic stand-in")
REF_LOGPROB_SYNTHETIC = Backend("ref_logprob", "nodes.synthetic:Logprob", doc="deterministic stand-in")

UPDATE_TORCH = Backend("update", "nodes.update:Update", uses_model=True, data_parallel=True, check=_torch_trainer,
                       doc="decoupled PPO, AdamW; full or LoRA; data-parallel over the pool's actors")
UPDATE_SYNTHETIC = Backend("update", "nodes.synthetic:Update", doc="stand-in work of `cost` seconds")

SYNC_TORCH = Backend("sync", "nodes.sync:Sync", uses_model=True, check=_torch_sync,
                     doc="full weights or LoRA adapter tensors")
SYNC_SYNTHETIC = Backend("sync", "nodes.synthetic:Sync", doc="the version only")
