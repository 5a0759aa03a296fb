"""Synthetic nodes: the real graph plumbing with stand-in work, so graphs run without a model.

Each node spends its ``cost`` seconds the way ``cost_mode`` says: ``wait``
sleeps (accelerator time: the host CPU stays free) and ``burn`` spins one CPU
thread. Outputs are deterministic functions of the step, the sample and the
weights version, so every executor must produce the same values.

The synthetic policy "learns" by construction: a sample answers its prompt
correctly with probability ``min(0.95, 0.1 + 0.05 * version)``, so reward
curves rise as versions advance. It tests plumbing, not RL.
"""

from __future__ import annotations

import time
import zlib

from omnigraph.data import SampleBatch, Weights


def spend(seconds: float | None, mode: str = "wait") -> None:
    if not seconds:
        return
    if mode == "wait":
        time.sleep(seconds)
        return
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x += i * i


def _unit(*key) -> float:
    """A deterministic number in [0, 1) from a key."""
    return zlib.crc32(repr(key).encode()) / 2**32


class SyntheticNode:
    def __init__(self, name, spec, ctx):
        self.name, self.spec, self.ctx = name, spec, ctx

    def spend(self) -> None:
        spend(self.spec.cost, self.spec.cost_mode)


class Generate(SyntheticNode):
    def __call__(self, step: int, weights: Weights) -> dict:
        self.spend()
        ctx, task = self.ctx, self.ctx.spec.task
        prompts = ctx.task.batch(step)
        per = len(prompts) // ctx.world
        mine = range(ctx.rank * per, (ctx.rank + 1) * per)
        p_right = min(0.95, 0.1 + 0.05 * weights.version)
        texts, completions, targets, groups = [], [], [], []
        for i in mine:
            for s in range(task.samples_per_prompt):
                target = prompts[i].meta["target"]
                right = _unit(ctx.seed, step, i, s, weights.version) < p_right
                texts.append(prompts[i].text)
                completions.append(" " + (target if right else target[::-1] + "0"))
                targets.append(target)
                groups.append(step * task.prompts + i)
        n = len(groups)
        return {"rollout": SampleBatch(step, groups, [weights.version] * n, [weights.version] * n,
                                       {"prompt": texts, "completion": completions, "target": targets,
                                        "logprob": [-_unit("lp", g, k) for k, g in enumerate(groups)]})}


class Logprob(SyntheticNode):
    """old_logprob / ref_logprob: a deterministic function of the sample and the trainer's version."""

    def __call__(self, step: int, batch: SampleBatch) -> dict:
        self.spend()
        v = self.ctx.state.policy_version if self.spec.kind == "old_logprob" else 0
        key = "old_logprob" if self.spec.kind == "old_logprob" else "ref_logprob"
        values = [-_unit(key, g, k, v) for k, g in enumerate(batch.group_ids)]
        return {"batch": batch.with_fields(**{key: values})}


class Update(SyntheticNode):
    def __call__(self, step: int, batch: SampleBatch) -> dict:
        self.spend()
        adv = batch.fields.get("advantage", [0.0] * len(batch))
        self.ctx.log(loss=-sum(adv) / max(len(adv), 1))
        return {"weights": Weights(version=self.ctx.state.policy_version + 1)}


class Sync(SyntheticNode):
    def __call__(self, step: int, weights: Weights) -> dict:
        self.spend()
        self.ctx.log(sync_bytes=weights.nbytes)
        return {"weights": Weights(version=weights.version, payload=self.spec.payload)}
