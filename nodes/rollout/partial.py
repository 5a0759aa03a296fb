"""Partial rollouts (``generate: {partial: {budget_tokens | budget_s, max_spans}}``): long completions continue
in the next firing on whatever weights arrived.

A firing decodes every unfinished sample the rollout holds (the prompt groups it
carried in, then the new prompts' samples) for at most the budget: ``budget_tokens``
new tokens per sample, or ``budget_s`` seconds. A sample in its last allowed
firing (``max_spans``), and every sample in the run's last firing, runs to its
end (a stop token or ``max_new_tokens``), so no sample spans more firings than the
compiler's proof assumes and none is left over. The firing returns the groups
whose samples have all finished (GRPO normalises advantages within a group);
the others stay here, with each token's id, its sampling logprob and the
weights version that sampled it, and are continued from ``prompt + tokens so
far`` with the remaining token budget.

A backend provides ``continue_rows(rows, budgets, seed=, deadline=, final=)``:
token-id rows in, for each ``(new tokens, their logprobs, stopped)``, at most
``budgets[i]`` new tokens; with a ``deadline`` (``time.perf_counter()``) the
rows not ``final`` stop when it passes.

The state (:meth:`Carry.state_dict`) goes into the checkpoint: ``--resume``
continues the same samples from the same tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from omnigraph.sdk import Prompt


@dataclass
class Sample:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The weights version that sampled each token."""
    spans: int = 0
    """Firings this sample has been decoded in."""
    done: bool = False
    before: int = 0
    """Tokens it had when the current firing began (carried tokens)."""
    pixels: Any = None
    """The prompt's pixel values (prompts with pictures), read again by every firing that continues it."""


@dataclass
class Group:
    prompt: Prompt
    samples: list[Sample]
    step: int
    """The firing that began it."""


class Carry:
    """The prompt groups a rollout holds between firings, and one firing over them."""

    def __init__(self, spec, max_new_tokens: int, iterations: int):
        self.spec = spec
        self.C = max_new_tokens
        self.last = iterations - 1
        self.groups: dict[int, Group] = {}
        self.stats: dict[str, float] = {}

    def in_flight(self) -> list[int]:
        return sorted(self.groups)

    def fire(self, step: int, prompts: list[Prompt], ids: list[list[int]], k: int, version: int, sampler,
             seed: int, pixels: list | None = None) -> list[Group]:
        """Decode one firing; return the finished groups (in group order), keep the rest. ``pixels``: each
        prompt's pixel values, where the prompts have pictures."""
        carried = len(self.groups)
        for i, (p, row) in enumerate(zip(prompts, ids)):
            shown = None if pixels is None else pixels[i]
            self.groups[p.group] = Group(p, [Sample(list(row), pixels=shown) for _ in range(k)], step)
        rows = [s for g in self.groups.values() for s in g.samples if not s.done]
        drain = step >= self.last
        final = [drain or s.spans + 1 >= self.spec.max_spans for s in rows]
        budget = self.spec.budget_tokens
        budgets = [self.C - len(s.tokens) if f or budget is None else min(budget, self.C - len(s.tokens))
                   for s, f in zip(rows, final)]
        deadline = None if self.spec.budget_s is None else time.perf_counter() + self.spec.budget_s
        for s in rows:
            s.before = len(s.tokens)
        t0 = time.perf_counter()
        out = self._decode(rows, budgets, final, sampler, seed, deadline)
        dt = time.perf_counter() - t0
        new = 0
        for s, f, (toks, lps, stopped) in zip(rows, final, out):
            s.tokens += list(toks)
            s.logprobs += [float(x) for x in lps]
            s.versions += [version] * len(toks)
            s.spans += 1
            s.done = stopped or f or len(s.tokens) >= self.C
            new += len(toks)
        ready = [g for g in sorted(self.groups) if all(s.done for s in self.groups[g].samples)]
        finished = [self.groups.pop(g) for g in ready]
        done = [s for g in finished for s in g.samples]
        self.stats = {
            "partial_rows": len(rows), "partial_new_tokens": new, "gen_tokens_per_s": new / max(dt, 1e-9),
            "carried_groups_in": carried, "carried_groups_out": len(self.groups),
            "carried_rows": sum(1 for s in rows if s.spans > 1),
            "carried_tokens": sum(s.before for s in done), "returned_tokens": sum(len(s.tokens) for s in done),
            "spans_mean": sum(s.spans for s in done) / max(len(done), 1),
            "spans_max": max((s.spans for s in done), default=0),
            "finished_groups": len(finished)}
        return finished

    @staticmethod
    def _decode(rows: list[Sample], budgets: list[int], final: list[bool], sampler, seed: int, deadline):
        """Carried rows (long prefixes) and new rows (prompts only) in two batches: one batch would left-pad
        every new prompt to the longest carried prefix and recompute that padding at every step. New rows get
        the firing's seed, so a firing with nothing carried samples exactly what generation without partial
        rollouts samples."""
        out: list = [None] * len(rows)
        for part, salt in (([i for i, s in enumerate(rows) if s.spans > 0], 1),
                           ([i for i, s in enumerate(rows) if s.spans == 0], 0)):
            if not part:
                continue
            shown = [rows[i].pixels for i in part]
            extra = {"pixels": shown} if any(p is not None for p in shown) else {}
            got = sampler([rows[i].prompt + rows[i].tokens for i in part], [budgets[i] for i in part],
                          seed=(seed + salt * 0x9E3779B1) % 2**32, deadline=deadline, final=[final[i] for i in part],
                          **extra)
            for i, r in zip(part, got):
                out[i] = r
        return out

    def state_dict(self) -> dict:
        return {"groups": {g: (grp.prompt, grp.step, [vars(s).copy() for s in grp.samples])
                           for g, grp in self.groups.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.groups = {g: Group(p, [Sample(**s) for s in samples], step)
                       for g, (p, step, samples) in state["groups"].items()}
