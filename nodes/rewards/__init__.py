"""Rewards (role scorer): rule-based reward functions (:mod:`.rules`), GRPO advantages (:mod:`.scorer`), reward
models (:mod:`.model`).

This module holds the reward backends' descriptors (registered under ``omnigraph.backends``) and their checks.
It is light (no torch): the compiler reads it before anything starts.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnigraph.sdk import Backend, ConfigError, load
from omnigraph.sdk.registry import table


def _reward_function(node, options, spec) -> list:
    out = _no_model(node, options, spec) or _resolves(node, options.fn, "fn")
    episodes = any(getattr(n, "env", None) is not None or getattr(n, "agent", None) is not None
                   for n in spec.nodes.values())
    if not out and not episodes and (options.fn == "env" or options.env_weight):
        field, what = ("fn", "fn: env") if options.fn == "env" else ("env_weight", "env_weight")
        out.append(ConfigError(f"{what} scores multi-turn episodes or agent runs, but no generate node has an env "
                               "or an agent", where=f"nodes.{node}.{field}",
                               fix="give the generate node env: {name: ...} or agent: {...}, or score with another fn"))
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



REWARD_PYTHON = Backend("reward", "nodes.rewards.scorer:Reward", check=_reward_function,
                        doc="a reward function per sample, GRPO advantages")
REWARD_SYNTHETIC = Backend("reward", "nodes.rewards.scorer:Reward", check=_no_model, doc="exact match, no function")
REWARD_MODEL = Backend("reward", "nodes.rewards.model:RewardModel", check=_reward_model,
                       doc="a sequence-classification reward model, batched on its pool's device; GRPO advantages")
