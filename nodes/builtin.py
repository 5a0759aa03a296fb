"""omnigraph's own backends, registered in its ``pyproject.toml`` exactly as a user's package registers its
own (entry-point group ``omnigraph.backends``, names ``<kind>.<backend>``).

This module is light (no torch): the compiler reads these descriptors, and runs their ``check`` on a
graph, before anything starts; each ``impl`` is imported only on the actors that run the node.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnigraph.sdk import Backend, ConfigError, load
from omnigraph.sdk.registry import table


def _not_merged(node, options, spec) -> list:
    if options.lora_serving == "merged":
        return [ConfigError(f"lora_serving: merged is a vllm backend option (this node uses backend "
                            f"{options.backend})", where=f"nodes.{node}.lora_serving", fix="remove it, or set backend: vllm")]
    return []


def _reward_function(node, options, spec) -> list:
    out = _no_model(node, options, spec) or _resolves(node, options.fn, "fn")
    episodes = any(getattr(n, "env", None) is not None for n in spec.nodes.values())
    if not out and not episodes and (options.fn == "env" or options.env_weight):
        field, what = ("fn", "fn: env") if options.fn == "env" else ("env_weight", "env_weight")
        out.append(ConfigError(f"{what} scores multi-turn episodes, but no generate node has an env",
                               where=f"nodes.{node}.{field}",
                               fix="give the generate node env: {name: ...}, or score with another fn"))
    return out


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


def _static_decode(node, options, spec) -> list:
    """``decode: static`` compiles a CUDA graph per token: it needs a pool with GPUs."""
    pool = spec.pools.get(options.pool)
    if options.decode.mode == "static" and pool is not None and pool.gpus <= 0:
        return [ConfigError(f"decode: static compiles the decode step for CUDA, but pool '{options.pool}' has no GPU",
                            where=f"nodes.{node}.decode", fix="use decode: auto (static on CUDA, eager on the CPU) "
                                                              f"or eager, or give pools.{options.pool} gpus")]
    return []


def _hf_only_decode(node, options, spec) -> list:
    if options.decode.mode != "auto":
        return [ConfigError(f"decode is a backend hf option (this node uses backend {options.backend})",
                            where=f"nodes.{node}.decode", fix="remove it, or set backend: hf")]
    return []


def _token_generator(node, options, spec) -> list:
    return (_not_merged(node, options, spec) + _episodes(node, options, spec) + _not_partial_episodes(node, options, spec)
            + _static_decode(node, options, spec))


def _vllm_generator(node, options, spec) -> list:
    return _episodes(node, options, spec) + _not_partial_episodes(node, options, spec) + _hf_only_decode(node, options, spec)


def _synthetic_generator(node, options, spec) -> list:
    out = _not_merged(node, options, spec) + _hf_only_decode(node, options, spec)
    if options.env is not None:
        out.append(ConfigError("multi-turn episodes need a token generator, not synthetic stand-in work",
                               where=f"nodes.{node}.env", fix="use backend: hf or vllm, or remove env"))
    return out


def _no_model(node, options, spec) -> list:
    if getattr(options, "model", None) is not None:
        return [ConfigError(f"a reward model is scored by backend model, not {options.backend}",
                            where=f"nodes.{node}.model",
                            fix="remove backend (model: implies backend: model), or remove model to score with fn")]
    if getattr(options, "gold", None) is not None:
        return [ConfigError("gold is logged beside a reward model's reward; this node has no model",
                            where=f"nodes.{node}.gold", fix="remove gold, or set model: (e.g. tiny-rm)")]
    return []


def _resolves(node, fn: str, field: str) -> list:
    try:
        load("rewards", fn)
    except LookupError as e:
        return [ConfigError(str(e), where=f"nodes.{node}.{field}",
                            fix="name a registered reward (omnigraph.rewards) or module:function")]
    return []


def _reward_model(node, options, spec) -> list:
    """``model`` and ``fn`` exclusive; the model registered, or a local folder whose config has a
    sequence-classification head (a registered model is built on the actor, and checked there)."""
    where = f"nodes.{node}.model"
    if options.model is None:
        return [ConfigError("backend model needs a reward model", where=where,
                            fix="set model: tiny-rm (or a local Hugging Face sequence-classification folder), "
                                "or use backend: python with fn")]
    if options.fn is not None:
        return [ConfigError("fn and model are exclusive: the reward comes from the model", where=f"nodes.{node}.fn",
                            fix="remove fn, or remove model to score with fn; a reward function logged beside "
                                "the model's reward goes in gold:")]
    out = _resolves(node, options.gold, "gold") if options.gold else []
    if options.model in table("models"):
        return out
    known = ", ".join(sorted(table("models")))
    try:
        path = Path(options.model).expanduser() / "config.json"
        found = path.is_file()
    except (OSError, ValueError, RuntimeError):       # '~nobody/rm', a NUL byte
        found = False
    if not found:
        return out + [ConfigError(f"'{options.model}' is neither a registered model nor a Hugging Face model "
                                  "directory (no config.json)", where=where,
                                  fix=f"use a registered model ({known}) or a folder made by save_pretrained")]
    try:
        config = json.loads(path.read_text())
        archs, labels = config.get("architectures") or [], len(config.get("id2label") or {0: ""})
    except (OSError, ValueError, AttributeError) as e:
        return out + [ConfigError(f"cannot read {path}: {e}", where=where, fix="point model at a complete model folder")]
    fix = f"use a model saved from AutoModelForSequenceClassification with num_labels=1 (e.g. {known})"
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        return out + [ConfigError(f"'{options.model}' has no sequence-classification head (architectures: "
                                  f"{', '.join(archs) or 'none'})", where=where, fix=fix)]
    if labels != 1:
        return out + [ConfigError(f"'{options.model}' gives {labels} scores per text; a reward model gives one",
                                  where=where, fix=fix)]
    return out


def _torch_trainer(node, options, spec) -> list:
    out = []
    pool = spec.pools[options.pool]
    if spec.model.dtype == "float16":
        out.append(ConfigError("float16 training needs a gradient scaler, which the torch trainer does not use "
                               "(small gradients underflow to zero)", where="model.dtype",
                               fix="use bfloat16 (mixed precision: fp32 master weights, bf16 compute) or float32; "
                                   "float16 rollouts alone: nodes.<generate>.dtype: float16"))
    if (pool.actors > 1 or pool.sharding != "none") and 0 < pool.gpus < 1:
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
    if options.payload in ("full", "delta") and lora:
        return [ConfigError(f"the update node trains LoRA adapters: send them, not the {options.payload} weights"
                            + (" (a delta is of full-weight training; an adapter is already small)"
                               if options.payload == "delta" else ""),
                            where=f"nodes.{node}.payload", fix="set payload: lora")]
    if options.payload == "delta":
        gens = [n for n, s in spec.nodes.items() if s.kind == "generate" and any(
            e.src == node and e.dst == n for e in spec.edges)]
        other = [n for n in gens if spec.nodes[n].backend != "hf"]
        if other:
            return [ConfigError(f"payload delta is written position by position into the rollout's own tensors; "
                                f"generate node '{other[0]}' has backend {spec.nodes[other[0]].backend}, whose "
                                "engine keeps its weights fused (vLLM's qkv, gate_up)", where=f"nodes.{node}.payload",
                                fix="set payload: full, or use backend: hf on the generate node")]
    return []


WARM_MODEL = "nodes.models:warm"
"""Warm workers import the model's architecture code with the backend's module (``Backend.warm``)."""

GENERATE_HF = Backend("generate", "nodes.rollout.hf:Generate", uses_model=True, partial=True, check=_token_generator,
                      warm=WARM_MODEL, doc="transformers generate: batched sampling with per-token logprobs")
GENERATE_VLLM = Backend("generate", "nodes.rollout.vllm_engine:VllmGenerate", uses_model=True, partial=True,
                        check=_vllm_generator, warm=False,   # vLLM binds OpenMP to its cores: torch must load after
                        doc="a vLLM engine in the rollout actor, weights loaded in place (extra: vllm)")
GENERATE_SYNTHETIC = Backend("generate", "nodes.synthetic:Generate", partial=True, check=_synthetic_generator,
                             doc="stand-in work of `cost` seconds")

REWARD_PYTHON = Backend("reward", "nodes.rewards.scorer:Reward", check=_reward_function,
                        doc="a reward function per sample, GRPO advantages")
REWARD_SYNTHETIC = Backend("reward", "nodes.rewards.scorer:Reward", check=_no_model, doc="exact match, no function")
REWARD_MODEL = Backend("reward", "nodes.rewards.model:RewardModel", check=_reward_model,
                       doc="a sequence-classification reward model, batched on its pool's device; GRPO advantages")

OLD_LOGPROB_TORCH = Backend("old_logprob", "nodes.trainer.logprob:Logprob", uses_model=True, sharded=True, warm=WARM_MODEL,
                            doc="the trainer's current weights (fused into a one-step update)")
REF_LOGPROB_TORCH = Backend("ref_logprob", "nodes.trainer.logprob:Logprob", uses_model=True, sharded=True, warm=WARM_MODEL,
                            doc="the initial weights")
LOGPROB_SYNTHETIC = Backend("old_logprob", "nodes.synthetic:Logprob", doc="deterministic stand-in")
REF_LOGPROB_SYNTHETIC = Backend("ref_logprob", "nodes.synthetic:Logprob", doc="deterministic stand-in")

UPDATE_TORCH = Backend("update", "nodes.trainer.update:Update", uses_model=True, data_parallel=True, sharded=True,
                       warm=WARM_MODEL, check=_torch_trainer,
                       doc="decoupled PPO, AdamW; full or LoRA; data-parallel or FSDP2-sharded over the pool's actors")
UPDATE_SYNTHETIC = Backend("update", "nodes.synthetic:Update", doc="stand-in work of `cost` seconds")

SYNC_TORCH = Backend("sync", "nodes.trainer.sync:Sync", uses_model=True, sharded=True, check=_torch_sync, warm=WARM_MODEL,
                     doc="full weights or LoRA adapter tensors")
SYNC_SYNTHETIC = Backend("sync", "nodes.synthetic:Sync", doc="the version only")


def _flow_generator(node, options, spec) -> list:
    out = []
    if options.eval_every:
        out.append(ConfigError("the flow generator has no greedy evaluation", where=f"nodes.{node}.eval_every",
                               fix="set eval_every: 0 (the reward of every batch is logged)"))
    if options.env is not None or options.partial is not None:
        field = "env" if options.env is not None else "partial"
        out.append(ConfigError(f"{field} is for token generators; the flow generator samples whole images",
                               where=f"nodes.{node}.{field}", fix=f"remove {field}, or use backend: hf or vllm"))
    bad = sorted(set(options.options) - {"steps", "noise_level", "shift"})
    if bad:
        out.append(ConfigError(f"unknown flow generator option {bad[0]}", where=f"nodes.{node}.options.{bad[0]}",
                               fix="use steps, noise_level or shift"))
    return out


def _image_reward(node, options, spec) -> list:
    if options.fn is None or options.model is not None:
        return [ConfigError("backend image scores images with fn(images, prompts)", where=f"nodes.{node}.fn",
                            fix="set fn: nodes.diffusion.flowgrpo:centred (or your own module:function)")]
    return _resolves(node, options.fn, "fn")


def _flow_update(node, options, spec) -> list:
    bad = sorted(set(options.options) - {"timestep_fraction", "adv_clip"})
    if bad:
        return [ConfigError(f"unknown flow update option {bad[0]}", where=f"nodes.{node}.options.{bad[0]}",
                            fix="use timestep_fraction or adv_clip")]
    return []


GENERATE_FLOW = Backend("generate", "nodes.diffusion.flowgrpo:Generate", uses_model=True, check=_flow_generator,
                        doc="a flow-matching image model sampled with FlowGRPO's SDE, per-step logprobs")
REWARD_IMAGE = Backend("reward", "nodes.diffusion.flowgrpo:ImageReward", check=_image_reward,
                       doc="fn(images, prompts) on the final images, GRPO advantages")
OLD_LOGPROB_FLOW = Backend("old_logprob", "nodes.diffusion.flowgrpo:Logprob", uses_model=True,
                           doc="the sampled transitions' logprobs under the trainer's weights")
UPDATE_FLOW = Backend("update", "nodes.diffusion.flowgrpo:Update", uses_model=True, check=_flow_update,
                      doc="FlowGRPO: PPO-clip over a subset of the denoising steps, AdamW")
SYNC_FLOW = Backend("sync", "nodes.diffusion.flowgrpo:Sync", uses_model=True, check=_torch_sync,
                    doc="the image model's full weights or LoRA adapter tensors")
