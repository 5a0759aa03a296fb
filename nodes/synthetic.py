"""Synthetic nodes: the real graph plumbing with stand-in work, so graphs run without a model.

Each node spends its ``cost`` seconds the way ``cost_mode`` says: ``wait``
sleeps (accelerator time: the host CPU stays free) and ``burn`` spins one CPU
thread. Outputs are deterministic functions of the step, the sample and the
weights version, so every executor must produce the same values.

The synthetic policy "learns" by construction: a sample answers its prompt
correctly with probability ``min(0.95, 0.1 + 0.05 * version)``, so reward
curves rise as versions advance. It tests plumbing, not RL.

With ``partial:`` the generator is a per-token stand-in (:mod:`nodes.rollout.partial`):
each sample draws a long-tailed length (most a few tokens, some up to
``max_new_tokens``), a firing decodes every unfinished sample within its budget
and costs ``options.cost_per_token`` seconds per decode step of its longest
row (a batched decode), so partial rollouts change the step time the way
they do on a real engine.
"""

from __future__ import annotations

import time
import zlib

from pydantic import Field

from omnigraph.sdk import Backend, ConfigError, NodeContext, Options, Prompt, SampleBatch, Weights

from nodes.nonfinite import Streak, count, warn
from nodes.rollout.partial import Carry


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


def length(seed: int, key: tuple, most: int) -> int:
    """A long-tailed completion length in ``1..most``: most samples short, a few near ``most``."""
    return 1 + int((most - 1) * _unit("len", seed, *key) ** 6)


class Generate(SyntheticNode):
    def __init__(self, ctx: NodeContext):
        super().__init__(ctx)
        p = getattr(self.options, "partial", None)
        self.carry = None if p is None else Carry(p, self.options.max_new_tokens, ctx.run.iterations)
        self.ctx_options = ctx.backend_options

    def load_weights(self, weights: Weights) -> None:
        pass                                       # a version is all a synthetic policy has

    def in_flight(self) -> list[int]:
        return self.carry.in_flight() if self.carry is not None else []

    def state_dict(self) -> dict:
        return {"carry": self.carry.state_dict()} if self.carry is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.carry is not None and "carry" in state:
            self.carry.load_state_dict(state["carry"])

    def continue_rows(self, rows, budgets, *, seed, deadline=None, final=None):
        """Rows are ``[group, length, 0, 0, ...]``: the first token a sample draws is its length."""
        per_token = (self.ctx_options or SyntheticGenerateOptions()).cost_per_token
        final = final or [False] * len(rows)
        if deadline is not None and per_token:          # tokens that fit before the deadline
            fit = max(1, int((deadline - time.perf_counter()) / per_token))
            budgets = [b if f else min(b, fit) for b, f in zip(budgets, final)]
        out = []
        for i, (row, b) in enumerate(zip(rows, budgets)):
            total = row[1] if len(row) > 1 else length(seed, (row[0], i), self.options.max_new_tokens)
            have = len(row) - 1
            n = min(b, total - have)
            toks = ([total] + [0] * (n - 1)) if have == 0 else [0] * n
            out.append((toks, [-_unit("lp", row[0], have + j) for j in range(n)], have + n >= total))
        spend(per_token * max((len(t) for t, _, _ in out), default=0), self.options.cost_mode)
        return out

    def _generate_partial(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        k = self.ctx.run.samples_per_prompt
        done = self.carry.fire(step, prompts, [[p.group] for p in prompts], k, weights.version, self.continue_rows,
                               zlib.crc32(f"gen:{self.ctx.seed}:{step}:{self.ctx.rank}".encode()))
        self.ctx.log(**self.carry.stats)
        samples = [(g.prompt, s) for g in done for s in g.samples]
        lo = [min(s.versions) for _, s in samples]
        fields = {"prompt": [p.text for p, _ in samples], "target": [p.meta["target"] for p, _ in samples],
                  "completion": [], "logprob": [s.logprobs[0] for _, s in samples],
                  "token_version": [list(s.versions) for _, s in samples], "spans": [s.spans for _, s in samples]}
        for j, (p, s) in enumerate(samples):
            right = _unit(self.ctx.seed, step, p.group, j, lo[j]) < min(0.95, 0.1 + 0.05 * lo[j])
            fields["completion"].append(" " + (p.meta["target"] if right else p.meta["target"][::-1] + "0"))
        return SampleBatch(step, [p.group for p, _ in samples], lo, [max(s.versions) for _, s in samples], fields)

    def generate(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        if self.carry is not None:
            return self._generate_partial(step, prompts, weights)
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
    """A stand-in update with the real one's guard (:mod:`nodes.nonfinite`): a batch with a NaN or inf
    advantage is not trained on (the version stays), counted and logged."""

    def __init__(self, ctx: NodeContext):
        super().__init__(ctx)
        self.nonfinite = Streak()

    def train(self, step: int, batch: SampleBatch) -> None:
        self.spend()
        adv = list(batch.fields.get("advantage", [0.0] * len(batch)))
        if self.ctx.fault("advantage") and adv:
            adv[0] = float("nan")
        bad = count(adv)
        if bad:
            warn(self.ctx.name, f"step {step}", {"advantage": bad}, "the update is skipped")
            self.ctx.log(**self.nonfinite.record(True))
            return
        self.ctx.log(loss=-sum(adv) / max(len(adv), 1), **self.nonfinite.record(False))
        self.ctx.shared["synthetic_version"] = self.ctx.shared.get("synthetic_version", 0) + 1

    def state_dict(self) -> dict:
        return {"version": self.ctx.shared.get("synthetic_version", 0), "nonfinite": self.nonfinite.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ctx.shared["synthetic_version"] = state["version"]
        self.nonfinite.load_state_dict(state.get("nonfinite"))


class Sync(SyntheticNode):
    @property
    def payload(self) -> str:
        return self.options.payload

    def state(self):
        self.spend()
        return None                                # version-only: nothing for a transport to carry


# -- descriptors (registered under omnigraph.backends; this module is light: the compiler reads them)

def _synthetic_generator(node, options, spec) -> list:
    if options.env is not None:
        return [ConfigError("multi-turn episodes need a token generator, not synthetic stand-in work",
                            where=f"nodes.{node}.env", fix="use backend: hf or vllm, or remove env")]
    return []


class SyntheticGenerateOptions(Options):
    """Options of the synthetic generator (``nodes.<generate>.options``)."""

    cost_per_token: float = Field(0.0, ge=0, le=3600)
    """Seconds per decode step of a firing's longest row, on top of ``cost`` (partial rollouts: a budget then
    bounds the firing's time)."""


GENERATE_SYNTHETIC = Backend("generate", "nodes.synthetic:Generate", partial=True, options=SyntheticGenerateOptions,
                             check=_synthetic_generator,
                             doc="stand-in work of `cost` seconds")
LOGPROB_SYNTHETIC = Backend("old_logprob", "nodes.synthetic:Logprob", doc="deterministic stand-in")
REF_LOGPROB_SYNTHETIC = Backend("ref_logprob", "nodes.synthetic:Logprob", doc="deterministic stand-in")
UPDATE_SYNTHETIC = Backend("update", "nodes.synthetic:Update", doc="stand-in work of `cost` seconds")
SYNC_SYNTHETIC = Backend("sync", "nodes.synthetic:Sync", doc="the version only")
