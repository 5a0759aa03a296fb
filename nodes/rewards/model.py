"""The reward-model node (role scorer, backend ``model``): a learned reward instead of a function.

::

    score: {kind: reward, pool: rm, model: tiny-rm, gold: digits_match, micro_batch_size: 128}

``model`` is a registered model (``tiny-rm``, :mod:`nodes.zoo.tiny_rm`) or a local
Hugging Face folder saved from ``AutoModelForSequenceClassification`` with one
label; setting it selects this backend (``fn`` and ``model`` are exclusive,
checked when the graph is compiled). The node loads the model once on its
pool's device (``ctx.device``: a GPU when the pool has one), in eval mode, and
scores each sample's ``prompt + completion`` in micro-batches without
gradients; the tokenizer adds whatever special tokens the model was trained
with. Padding is on the right, with ``pad_token_id`` set in the model's config,
so Hugging Face's last-token pooling reads the last real token of every row.

The reward is the model's score; the advantages are the same GRPO advantages as
the function reward's (:func:`nodes.rewards.scorer.grpo_advantages`). It logs
``reward_mean``, ``reward_std``, ``nonfinite_rewards`` (a NaN or inf score: the update skips the step,
:func:`nodes.rewards.scorer.checked`) and ``rm_s`` (seconds in the model), and, with
``gold: <reward fn>``, ``gold_reward_mean``: a true reward computed beside the
proxy and never trained on, so a run shows whether the policy learns the task
or the reward model's mistakes. Eval batches are scored too (``eval_reward``
from the model, ``eval_gold_reward`` from ``gold``).

On its own pool the node runs beside the trainer's ``old_logprob``, and the
update joins the two branches (``graphs/grpo_reward_model.yaml``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from omnigraph.sdk import ConfigError, NodeContext, SampleBatch, load
from omnigraph.sdk.registry import table

from nodes.rewards.scorer import checked, episodes_of, grpo_advantages, sample_meta


def model_dir(name: str, seed: int, log=print) -> Path:
    """The local folder of ``model:``: a registered model is materialised (once, then cached)."""
    return Path(load("models", name)(seed, log)) if name in table("models") else Path(name).expanduser()


class RewardModel:
    def __init__(self, ctx: NodeContext):
        import torch
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        self.ctx, self.options = ctx, ctx.options
        where = f"nodes.{ctx.name}.model"
        path = model_dir(self.options.model, ctx.model.seed)
        config = AutoConfig.from_pretrained(path)
        if not any(a.endswith("ForSequenceClassification") for a in config.architectures or []) or \
                config.num_labels != 1:
            raise ConfigError(f"'{self.options.model}' is not a reward model (architectures: "
                              f"{', '.join(config.architectures or []) or 'none'}, {config.num_labels} labels)",
                              where=where, fix="use a model saved from AutoModelForSequenceClassification with "
                                               "num_labels=1, e.g. tiny-rm")
        self.tok = AutoTokenizer.from_pretrained(path)
        self.tok.padding_side = "right"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path).to(ctx.device).eval()
        self.model.requires_grad_(False)
        if self.model.config.pad_token_id is None:         # last-token pooling finds the last non-pad token
            self.model.config.pad_token_id = self.tok.pad_token_id
        self.gold = load("rewards", self.options.gold) if self.options.gold else None
        self.torch = torch

    def rewards(self, prompts: list[str], completions: list[str]) -> list[float]:
        """The model's score of each ``prompt + completion``, ``micro_batch_size`` texts per forward pass."""
        texts = [p + c for p, c in zip(prompts, completions)]
        mb = self.options.micro_batch_size
        out: list[float] = []
        with self.torch.inference_mode():
            for i in range(0, len(texts), mb):
                enc = self.tok(texts[i:i + mb], return_tensors="pt", padding=True).to(self.ctx.device)
                out += self.model(**enc).logits[:, 0].float().tolist()
        return out

    def _gold(self, prompts, completions, metas) -> list[float]:
        return [float(self.gold(p, c, **m)) for p, c, m in zip(prompts, completions, metas)]

    def score(self, step: int, rollout: SampleBatch) -> SampleBatch:
        f = rollout.fields
        t0 = time.perf_counter()
        rewards = self.rewards(f["prompt"], f["completion"])
        logs = {"rm_s": time.perf_counter() - t0}
        rewards, checks = checked(self.ctx, step, rewards)      # a NaN score: the update skips the step
        logs.update(checks)
        adv = grpo_advantages(rewards, rollout.group_ids, self.options.normalize_std, episodes_of(rollout))
        if self.gold is not None:
            gold = self._gold(f["prompt"], f["completion"], [sample_meta(f, i) for i in range(len(rollout))])
            logs["gold_reward_mean"] = sum(gold) / max(len(gold), 1)
        ev = rollout.meta.get("eval")
        if ev is not None:
            scores = self.rewards(ev["prompt"], ev["completion"])
            logs.update(eval_reward=sum(scores) / max(len(scores), 1), eval_version=ev["version"])
            if self.gold is not None:
                gold = self._gold(ev["prompt"], ev["completion"], [sample_meta(ev, i) for i in range(len(scores))])
                logs["eval_gold_reward"] = sum(gold) / max(len(gold), 1)
        self.ctx.log(**logs)
        meta = {k: v for k, v in rollout.meta.items() if k != "eval"}   # scored once (the branches share it)
        return replace(rollout.with_fields(reward=rewards, advantage=adv), meta=meta)
