"""The reward node (role scorer): a reward function per sample, then GRPO group-normalised advantages.

The function is a registered reward (``fn: digits_match``, entry-point group
``omnigraph.rewards``) or a dotted path (``fn: my_pkg.rewards:exact``); it is
called as ``fn(prompt, completion, **meta)``: ``meta`` is the prompt's own (``Prompt.meta``: the ``target``
and, for prompts from data, every field of the row), so a verifier can read what it needs.
Backend ``synthetic`` scores an exact match without a function.

Advantages: each sample's reward minus its prompt group's mean, divided by
the group's standard deviation when ``normalize_std`` is on (plus 1e-6).

A NaN or inf reward is warned about, counted (``nonfinite_rewards``) and left in place: its group's
advantages come out non-finite, so the update skips the step (:mod:`nodes.nonfinite`); ``reward_mean`` and
``reward_std`` are of the finite rewards. ``OMNIGRAPH_INJECT="reward@5/rewards:corrupt"`` makes one NaN.

>>> grpo_advantages([1.0, 0.0, 0.5, 0.5], [7, 7, 8, 8], normalize_std=False)
[0.5, -0.5, 0.0, 0.0]
"""

from __future__ import annotations

import math
from collections import defaultdict

from omnigraph.sdk import NodeContext, SampleBatch, load

from nodes.nonfinite import count, warn
from nodes.synthetic import spend



def sample_meta(fields: dict, i: int) -> dict:
    """Sample ``i``'s keyword arguments for the reward function: its prompt's meta, else its target."""
    if "meta" in fields:
        return {"target": fields["target"][i], **fields["meta"][i]} if "target" in fields else dict(fields["meta"][i])
    return {"target": fields["target"][i]} if "target" in fields else {}


def checked(ctx: NodeContext, step: int, rewards: list[float]) -> tuple[list[float], dict[str, float]]:
    """The rewards after the ``rewards`` fault point (a test's ``corrupt``: the first one NaN), and their
    metrics: ``nonfinite_rewards`` (warned about when any), ``reward_mean``, ``reward_std`` and ``scored``
    of the finite ones."""
    if ctx.fault("rewards") and rewards:
        rewards = [float("nan")] + rewards[1:]
    bad = count(rewards)
    if bad:
        warn(ctx.name, f"step {step}", {"reward": bad}, "their groups' advantages are not finite: the update "
             "skips the step")
    ok = [r for r in rewards if math.isfinite(r)]
    mean = sum(ok) / max(len(ok), 1)
    return rewards, {"reward_mean": mean, "scored": len(rewards), "nonfinite_rewards": bad,
                     "reward_std": math.sqrt(sum((r - mean) ** 2 for r in ok) / max(len(ok), 1))}


def grpo_advantages(rewards: list[float], groups: list[int], normalize_std: bool = True,
                    episodes: list | None = None) -> list[float]:
    """Each sample's reward less its group's mean (over its group's std with ``normalize_std``).

    ``episodes``: which episode each sample belongs to, where one episode gave several samples (an agent's,
    split at a divergence): the episode counts once in its group, by its last sample's reward, and each of its
    samples gets the episode's advantage.

    >>> grpo_advantages([1.0, 0.0], [7, 7], normalize_std=False)
    [0.5, -0.5]
    >>> grpo_advantages([0.0, 1.0, 0.0], [7, 7, 7], normalize_std=False, episodes=[0, 0, 1])
    [0.5, 0.5, -0.5]
    """
    keys = [(g, e) for g, e in zip(groups, episodes)] if episodes is not None else list(enumerate(groups))
    final = dict(zip(keys, rewards))                       # an episode's last sample's reward
    by_group: dict[int, list[float]] = defaultdict(list)
    for key, r in final.items():
        by_group[key[0] if episodes is not None else groups[key[0]]].append(r)
    stats = {}
    for g, rs in by_group.items():
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / max(len(rs) - 1, 1)) if len(rs) > 1 else 0.0
        stats[g] = (mean, std)
    out = []
    for key, g in zip(keys, groups):
        mean, std = stats[g]
        a = final[key] - mean
        out.append(a / (std + 1e-6) if normalize_std else a)
    return out


def episodes_of(batch) -> list | None:
    """The episode of each sample where an agent rollout split one into several (else None)."""
    ids = [(m.get("episode") or {}).get("index") if isinstance(m, dict) else None for m in batch.fields.get("meta") or []]
    return ids if ids and None not in ids and len(set(zip(batch.group_ids, ids))) < len(ids) else None


class Reward:
    def __init__(self, ctx: NodeContext):
        self.ctx, self.options = ctx, ctx.options
        self.fn = load("rewards", self.options.fn) if self.options.backend == "python" else None

    def _score(self, prompt: str, completion: str, meta: dict) -> float:
        r = float(self.fn(prompt, completion, **meta))
        if self.options.env_weight and "episode" in meta:
            r += self.options.env_weight * float(meta["episode"]["reward"])
        return r

    def score(self, step: int, rollout: SampleBatch) -> SampleBatch:
        spend(self.options.cost, self.options.cost_mode)
        f = rollout.fields
        if self.fn is None:     # synthetic: exact-match score without a user function
            rewards = [float(c.strip() == t) for c, t in zip(f["completion"], f["target"])]
        else:
            metas = [sample_meta(f, i) for i in range(len(rollout))]
            rewards = [self._score(p, c, m) for p, c, m in zip(f["prompt"], f["completion"], metas)]
        rewards, logs = checked(self.ctx, step, rewards)
        adv = grpo_advantages(rewards, rollout.group_ids, self.options.normalize_std, episodes_of(rollout))
        ev = rollout.meta.pop("eval", None)
        if ev is not None and self.fn is not None:
            scores = [self._score(p, c, sample_meta(ev, i)) for i, (p, c) in enumerate(zip(ev["prompt"], ev["completion"]))]
            self.ctx.log(eval_reward=sum(scores) / max(len(scores), 1), eval_version=ev["version"],
                         eval_accuracy=sum(s >= 1.0 for s in scores) / max(len(scores), 1))
        self.ctx.log(**logs)
        return rollout.with_fields(reward=rewards, advantage=adv)
