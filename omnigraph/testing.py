"""Small graphs, and nodes built outside a run, for doctests, tests and benchmarks.

>>> canonical_graph("sync").name
'canonical-sync'
>>> gen, ctx = build_node(canonical_spec("one_step_off"), "generate")
>>> type(gen).__name__, ctx.actor, ctx.world
('Generate', 'rollout.0', 1)
"""

from __future__ import annotations

from typing import Any

from . import transports
from .executors import build
from .planning import compile
from .graph.spec import GraphSpec, PartialSpec
from .proof.validate import resolve


def canonical_spec(mode: str = "one_step_off", *, sync_every: int = 1, ahead: int | None = None,
                   iterations: int = 8, max_staleness: int = 1_000, cost: float | None = None,
                   colocate: bool = False, cost_mode: str = "wait", costs: dict[str, float] | None = None,
                   executor: str = "local", spans: int | None = None, cost_per_token: float = 0.0,
                   **schedule: Any) -> GraphSpec:
    """generate -> reward -> old_logprob -> update -> sync -> generate, synthetic nodes; ``spans``: the
    generator's partial rollouts (one token per firing, samples span up to ``spans`` firings)."""
    rollout, trainer = ("trainer", "trainer") if colocate else ("rollout", "trainer")
    node = {"backend": "synthetic", "cost_mode": cost_mode, **({"cost": cost} if cost is not None else {})}
    costs = costs or {}
    sched = {"mode": mode, "sync_every": sync_every, "iterations": iterations,
             "max_staleness": max_staleness, **schedule}
    if ahead is not None:
        sched["ahead"] = ahead
    spec = GraphSpec.model_validate({
        "name": f"canonical-{mode}",
        "pools": {rollout: {"actors": 1, "cpus": 1}, trainer: {"actors": 1, "cpus": 1}},
        "nodes": {
            "generate": {"kind": "generate", "pool": rollout, **node},
            "reward": {"kind": "reward", "pool": rollout, **node},
            "old_logprob": {"kind": "old_logprob", "pool": trainer, **node},
            "update": {"kind": "update", "pool": trainer, **node},
            "sync": {"kind": "sync", "pool": trainer, **node},
        },
        "edges": ["generate -> reward", "reward -> old_logprob", "old_logprob -> update",
                  "update -> sync", "sync -> generate"],
        "schedule": sched,
        "runtime": {"executor": executor},
    })
    for name, c in costs.items():
        spec.nodes[name].cost = c
    if spans is not None:
        gen = spec.nodes["generate"]
        gen.partial = PartialSpec(budget_tokens=1, max_spans=spans)
        gen.options = {**gen.options, "cost_per_token": cost_per_token}
    return spec


def canonical_graph(mode: str = "one_step_off", **kw: Any):
    return resolve(canonical_spec(mode, **kw))


def prompts(spec: GraphSpec, step: int, world: int = 1, rank: int = 0):
    """The prompts (with their group ids) the engine gives a generator of ``spec`` at ``step``."""
    return build.step_prompts(build.task_of(spec), step, spec.task.prompts, world, rank)


def export(spec: GraphSpec, exporter, version: int, node: str = "sync"):
    """What the exporter node ``exporter`` sends at ``version``, carried by the transport the plan chooses."""
    plan = compile(spec)
    return transports.make(plan.weights[node], node, spec.nodes[node]).export(exporter.state(), version)


def build_node(spec: GraphSpec, node: str, actor: str | None = None, shared: dict | None = None):
    """``(impl, ctx)``: the node ``node`` of ``spec`` built as its actor would build it (rank 0 of its pool,
    or ``actor``), for testing a node on its own. Nodes built with the same ``shared`` dict share what an
    actor's nodes share (the trainer's model)."""
    plan = compile(spec)
    actor = actor or f"{spec.nodes[node].pool}.0"
    ctx = build.context(plan, node, actor, {} if shared is None else shared)
    return build.node_class(plan.graph.nodes[node])(ctx), ctx


def initial_reward(rows, key: str = "reward_mean") -> float:
    """Mean reward of the batches sampled by the initial weights (version 0), before any update reached the
    rollout: where a training run started. ``rows`` are metrics rows or node-run records (merged by step);
    ``key`` another reward of the rows (e.g. ``gold_reward_mean``).

    >>> initial_reward([{"step": 0, "weights_version": 0, "reward_mean": 0.1},
    ...                 {"step": 1, "weights_version": 0}, {"step": 1, "reward_mean": 0.3},
    ...                 {"step": 2, "weights_version": 1, "reward_mean": 0.9}])
    0.2
    """
    steps: dict[int, dict] = {}
    for r in rows:
        steps.setdefault(r["step"], {}).update(r)
    first = [r[key] for r in steps.values() if r.get("weights_version") == 0 and key in r]
    if not first:
        raise ValueError("no batch sampled by the initial weights carries a reward")
    return round(sum(first) / len(first), 12)
