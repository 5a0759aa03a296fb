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

from omnigraph.sdk import NodeContext, Prompt, SampleBatch, Weights


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
    def __init__(self, ctx: NodeContext):
        self.ctx = ctx
        self.options = ctx.options

    def spend(self) -> None:
        spend(self.options.cost, self.options.cost_mode)

    def __call__(self, step: int, **inputs):      # kind: custom (tests use it as a do-nothing node)
        self.spend()
        return {}


class Generate(SyntheticNode):
    def load_weights(self, weights: Weights) -> None:
        pass                                       # a version is all a synthetic policy has

    def generate(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        self.spend()
        k = self.ctx.run.samples_per_prompt
        p_right = min(0.95, 0.1 + 0.05 * weights.version)
        texts, completions, targets, groups, lps = [], [], [], [], []
        for p in prompts:
            for s in range(k):
                target = p.meta["target"]
                right = _unit(self.ctx.seed, step, p.group, s, weights.version) < p_right
                texts.append(p.text)
                completions.append(" " + (target if right else target[::-1] + "0"))
                targets.append(target)
                groups.append(p.group)
                lps.append(-_unit("lp", p.group, s))
        n = len(groups)
        return SampleBatch(step, groups, [weights.version] * n, [weights.version] * n,
                           {"prompt": texts, "completion": completions, "target": targets, "logprob": lps})


class Logprob(SyntheticNode):
    """old_logprob / ref_logprob: a deterministic function of the sample and the trainer's version."""

    def logprobs(self, step: int, batch: SampleBatch) -> SampleBatch:
        self.spend()
        old = self.ctx.kind == "old_logprob"
        v = self.ctx.shared.get("synthetic_version", 0) if old else 0
        key = "old_logprob" if old else "ref_logprob"
        values = [-_unit(key, g, k, v) for k, g in enumerate(batch.group_ids)]
        return batch.with_fields(**{key: values})


class Update(SyntheticNode):
    def train(self, step: int, batch: SampleBatch) -> None:
        self.spend()
        adv = batch.fields.get("advantage", [0.0] * len(batch))
        self.ctx.log(loss=-sum(adv) / max(len(adv), 1))
        self.ctx.shared["synthetic_version"] = self.ctx.shared.get("synthetic_version", 0) + 1

    def state_dict(self) -> dict:
        return {"version": self.ctx.shared.get("synthetic_version", 0)}

    def load_state_dict(self, state: dict) -> None:
        self.ctx.shared["synthetic_version"] = state["version"]


class Sync(SyntheticNode):
    @property
    def payload(self) -> str:
        return self.options.payload

    def state(self):
        self.spend()
        return None                                # version-only: nothing for a transport to carry
