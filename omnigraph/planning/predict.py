"""Predicted step time: list-schedule the plan's tasks over a few steps.

Each actor runs its tasks in plan order, one step after another; a task
starts when its actor is free and the tasks it depends on in the same step
have finished (delayed inputs are already in the actor's buffer). Node costs
come from measured timings when given, else the node's ``cost``, else a
default per role. The steady-state step time is read off a window of whole
hyperperiods after the fill.

The same schedule is what ``omnigraph viz --timeline`` draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..proof.schedule import Firing
from ..proof.staleness import hyperperiod

DEFAULT_COST = {"generator": 1.0, "scorer": 0.05, "logprob": 0.2, "trainer": 0.5, "exporter": 0.05, "transform": 0.1}
STASH_COST = 0.0


@dataclass(frozen=True)
class Box:
    actor: str
    step: int
    label: str
    node: str
    op: str
    start: float
    end: float


@dataclass
class Prediction:
    step_s: float
    serial_s: float
    utilisation: dict[str, float]
    """Per actor: the fraction of the predicted span it spends computing."""
    boxes: list[Box] = field(default_factory=list)

    @property
    def overlap(self) -> float:
        return self.serial_s / self.step_s if self.step_s > 0 else 1.0


def node_cost(plan, node: str, timings: dict[str, float] | None = None) -> float:
    n = plan.graph.nodes[node]
    if timings and node in timings:
        return float(timings[node])
    if n.spec is not None and getattr(n.spec, "cost", None) is not None:
        return float(n.spec.cost)
    return DEFAULT_COST.get(n.role, 0.1)


def predict(plan, timings: dict[str, float] | None = None, steps: int | None = None) -> Prediction:
    h = hyperperiod(plan.graph)
    window = h * max(1, -(-4 // h))
    n_steps = steps or plan.fill + window + 2
    firing = Firing(plan.graph, iterations=10**9 if steps is None else max(0, steps - plan.fill))
    free = {a: 0.0 for a in plan.actors}
    boxes: list[Box] = []
    step_end: list[float] = []
    busy = {a: 0.0 for a in plan.actors}
    for t in range(min(n_steps, firing.steps)):
        fired = firing.next()
        done: dict = {}
        for task in plan.tasks:
            active = task.node in fired if task.op == "run" else task.edge.src in fired
            if not active:
                done[task] = 0.0
                continue
            ready = max((done.get(d, 0.0) for d in plan.deps[task]), default=0.0)
            start = max(free[task.actor], ready)
            cost = node_cost(plan, task.node, timings) if task.op == "run" else STASH_COST
            end = start + cost
            free[task.actor] = end
            done[task] = end
            if task.op == "run":
                busy[task.actor] += cost
            boxes.append(Box(task.actor, t, task.label, task.node, task.op, start, end))
        step_end.append(max(free.values()))
    last = len(step_end) - 1
    first = max(plan.fill, last - window)
    span = last - first
    step_s = (step_end[last] - step_end[first]) / span if span > 0 else (step_end[-1] if step_end else 0.0)
    serial = sum(node_cost(plan, n, timings) / plan.graph.nodes[n].every for n in plan.graph.nodes)
    total = step_end[-1] if step_end else 1.0
    return Prediction(step_s=step_s, serial_s=serial, utilisation={a: b / total for a, b in busy.items()}
                      if total else busy, boxes=boxes)


def idle_warnings(plan) -> list[str]:
    """Pools that the schedule runs one at a time: each one's cores wait while another pool works.

    Read off the predicted schedule (default costs per role): when the pools never overlap, the predicted
    step is the sum of the nodes' times, and splitting the machine into pools only took cores away from each
    node. The fix is one pool with all the cores (colocated), or a schedule that overlaps the pools."""
    pools = sorted({a.pool for a in plan.actors.values()})
    if len(pools) < 2 or not plan.tasks:
        return []
    p = predict(plan)
    if p.step_s <= 0 or p.overlap > 1.01:
        return []
    spec = plan.graph.spec
    cpus = sum(spec.pools[name].cpus * spec.pools[name].actors for name in pools)
    sizes = ", ".join(f"{name} ({spec.pools[name].actors}x{spec.pools[name].cpus:g} CPU"
                      + (f", {spec.pools[name].gpus:g} GPU" if spec.pools[name].gpus else "") + ")" for name in pools)
    return [f"idle cores: schedule {spec.schedule.mode} runs pools {sizes} one after another (predicted step = the "
            f"sum of the nodes' times, overlap {p.overlap:.2f}), so each pool's cores wait while another works; "
            f"colocate: one pool with all {cpus:g} CPUs and every node on it, or overlap the pools with a delayed "
            "data edge into the trainer (schedule one_step_off or async)"]
