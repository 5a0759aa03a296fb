"""The trainer (backend ``torch``): the policy (:mod:`.policy`), old and reference log-probs (:mod:`.logprob`), the
PPO update (:mod:`.update`, :mod:`.losses`), weight export (:mod:`.sync`), FSDP2 sharding (:mod:`.sharded`).

This module holds their descriptors (registered under ``omnigraph.backends``) and checks. It is light (no
torch): the compiler reads it before anything starts.
"""

from __future__ import annotations

from pydantic import Field

from omnigraph.sdk import Backend, ConfigError, Options, load

from nodes.trainer import memory

WARM_MODEL = "nodes.models:warm"
"""Warm workers import the model's architecture code with the backend's module (``Backend.warm``)."""


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
    out += _fits(node, options, spec, pool)
    if pool.actors > 1 and spec.runtime.executor == "local":
        out.append(ConfigError(f"data-parallel training over {pool.actors} trainer actors needs one process per "
                               "actor", where="runtime.executor",
                               fix=f"use the ray or ray-tasks executor, or pools.{options.pool}.actors: 1"))
    return out


def _fits(node, options, spec, pool) -> list:
    """An update whose weights, gradients and optimizer state (LoRA: its base weights), with the rollout's weights
    and KV cache where it shares the card, exceed the card (:mod:`nodes.trainer.memory`: a lower bound, checked
    where the card can be asked)."""
    if pool.gpus <= 0:
        return []
    lora = getattr(options, "lora", None) is not None
    need = memory.lora_state_gib(spec.model.path, spec.model.dtype) if lora else \
        memory.update_state_gib(spec.model.path, spec.model.freeze or (), spec.model.dtype)
    card = memory.card_gib() if need is not None else None
    if need is None or card is None:
        return []
    per_card = need / pool.actors if pool.sharding != "none" and not lora else need
    per = 4 * memory.master_bytes(spec.model.dtype)
    what = "LoRA's frozen base weights" if lora else f"weights, gradients and AdamW state ({per} bytes a parameter)"
    if per_card > card and not lora:     # the update alone does not fit
        return [ConfigError(f"a full-parameter update of this model keeps {per_card:.0f} GiB per card of {what} "
                            f"before any activation; the pool '{options.pool}' runs on cards of {card:.0f} GiB",
                            where=f"nodes.{node}.lora",
                            fix=f"train LoRA adapters (nodes.{node}.lora: {{r: 16}}), or shard the state over more "
                                f"cards (pools.{options.pool}.sharding: fsdp, actors: N)")]
    parts = [f"{per_card:.0f} GiB of {what}"]
    for gen, gib in _rollouts_on_card(options.pool, spec):
        per_card += gib
        parts.append(f"{gib:.0f} GiB of '{gen}''s weights and KV cache")
    if per_card <= card:             # the whole card (a pool with a fraction of it shares it: a lower bound still)
        return []
    return [ConfigError(f"one card holds {' and '.join(parts)}: {per_card:.0f} GiB before any activation, on a "
                        f"card of {card:.0f} GiB", where=f"pools.{options.pool}.gpus",
                        fix="give the rollout a card of its own (pools.<rollout>.gpus: 1), fewer rows or new tokens "
                            "a firing (task.prompts, task.samples_per_prompt, max_new_tokens)"
                            + ("" if lora else f", or LoRA (nodes.{node}.lora: {{r: 16}})"))]


def _rollouts_on_card(trainer_pool: str, spec) -> list[tuple[str, float]]:
    """The generators that share the trainer's card (its own pool, or fractions of one card on one host) and what
    each needs on it (:func:`nodes.trainer.memory.rollout_gib`; those it cannot count are left out)."""
    tp = spec.pools[trainer_pool]
    out = []
    for name, n in spec.nodes.items():
        if n.kind != "generate" or getattr(n, "lent", False) or getattr(n, "backend", "hf") != "hf":
            continue
        p = spec.pools[n.pool]
        shared = n.pool == trainer_pool or (0 < p.gpus < 1 and 0 < tp.gpus < 1 and p.gpus + tp.gpus <= 1
                                            and not spec.runtime.address)
        if not shared:
            continue
        rows = -(-spec.task.prompts * spec.task.samples_per_prompt // p.actors)
        env = getattr(n, "env", None)
        tokens = (getattr(env, "max_tokens", None) if env else None) or n.max_new_tokens
        tokens += spec.task.max_prompt_tokens or 0
        gib = memory.rollout_gib(spec.model.path, getattr(n, "dtype", None) or spec.model.dtype, rows, tokens)
        if gib is not None:
            out.append((name, gib))
    return out


def _capabilities(kind: str, backend: str) -> frozenset:
    try:
        return load("backends", f"{kind}.{backend}").capabilities
    except LookupError:
        return frozenset()


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
        other = [n for n in gens if "weight_targets" not in _capabilities("generate", spec.nodes[n].backend)]
        if other:
            return [ConfigError(f"payload delta is written position by position into the rollout's own tensors; "
                                f"generate node '{other[0]}' has backend {spec.nodes[other[0]].backend}, whose "
                                "engine keeps its weights fused (vLLM's qkv, gate_up)", where=f"nodes.{node}.payload",
                                fix="set payload: full, or use backend: hf on the generate node")]
    return []


OLD_LOGPROB_TORCH = Backend("old_logprob", "nodes.trainer.logprob:Logprob", uses_model=True, sharded=True,
                            warm=WARM_MODEL, doc="the trainer's current weights (fused into a one-step update)")
REF_LOGPROB_TORCH = Backend("ref_logprob", "nodes.trainer.logprob:Logprob", uses_model=True, sharded=True,
                            warm=WARM_MODEL, doc="the initial weights")


class UpdateOptions(Options):
    """The torch update's options (``nodes.<update>.options``): what makes a large model fit the card."""

    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them: less memory
    (a bigger model or micro-batch fits), about a third more compute. The update then scores rows without
    sharing their prompt's forward."""
    micro_batch_tokens: int | None = Field(None, ge=1, le=1 << 30)
    """A token budget per micro-batch instead of a count of rows: rows in order, each micro-batch as many as
    keep rows x (the prompt's columns + the longest completion among them) within it (at least one row), so
    long completions take small micro-batches and short ones large ones. ``micro_batch_size`` still caps the
    rows."""
    logprob_chunk: int | None = Field(None, ge=1, le=1 << 20)
    """Completion log-probs with the output head in chunks of this many positions, forward and backward: the
    whole vocabulary's logits are never held (a large vocabulary's biggest activation). The trainer's other
    forwards (old log-probs) use it too. Architectures whose logits are the head's plain product only."""


UPDATE_TORCH = Backend("update", "nodes.trainer.update:Update", uses_model=True, data_parallel=True, sharded=True,
                       warm=WARM_MODEL, check=_torch_trainer, options=UpdateOptions,
                       doc="decoupled PPO, AdamW; full or LoRA; data-parallel or FSDP2-sharded over the pool's actors")
SYNC_TORCH = Backend("sync", "nodes.trainer.sync:Sync", uses_model=True, sharded=True, check=_torch_sync,
                     warm=WARM_MODEL, doc="full weights or LoRA adapter tensors")
