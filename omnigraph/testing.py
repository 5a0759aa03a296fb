"""Small graphs for doctests, tests and benchmarks.

>>> canonical_graph("sync").name
'canonical-sync'
"""

from __future__ import annotations

from typing import Any

from .spec import GraphSpec


def canonical_spec(mode: str = "one_step_off", *, sync_every: int = 1, ahead: int | None = None,
                   iterations: int = 8, max_staleness: int = 1_000, cost: float | None = None,
                   colocate: bool = False, cost_mode: str = "wait", costs: dict[str, float] | None = None,
                   **schedule: Any) -> GraphSpec:
    """generate -> reward -> old_logprob -> update -> sync -> generate, synthetic nodes."""
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
        "runtime": {"executor": "local"},
    })
    for name, c in costs.items():
        spec.nodes[name].cost = c
    return spec


def canonical_graph(mode: str = "one_step_off", **kw: Any):
    from .validate import resolve
    return resolve(canonical_spec(mode, **kw))
