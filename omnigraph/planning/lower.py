"""Lowering: the validated graph onto actors (DESIGN: "Lowering onto Ray Compiled Graphs").

- every pool becomes ``actors`` actors named ``<pool>.<rank>``;
- a node runs on every actor of its pool (its data-parallel ranks), except an
  exporter (``sync``), which exports once, from rank 0;
- a zero-delay edge between actors is a channel, within an actor a plain
  local value; batches cross as host tensors (``shm``, or ``rdt`` for ``ray-tasks`` on a cluster:
  :func:`omnigraph.transports.choose_data`); weights take the
  path chosen once per exporter (:func:`omnigraph.transports.choose`);
- a delayed edge is a FIFO buffer held inside the consumer's actor: the
  consumer's ``run`` pops the value of ``t - d`` and a later ``stash`` task on
  the same actor stores this step's value. For weights the stash is the
  ``apply`` task on each rollout actor;
- each actor's task order is its projection of one global topological order
  of the tasks (runs before stashes), so no two actors can wait on each other;
- the process groups the executor forms before step 0: one NCCL group per
  exporter whose path is ``nccl``, one per data-parallel trainer pool.
"""

from __future__ import annotations

import heapq

from .. import plugins, transports
from ..graph.ir import Edge, Graph
from .precision import Precision, cpu_flags, resolve
from ..proof.schedule import Firing
from ..proof.staleness import Report
from .plan import Actor, Channel, Group, Plan, Task, feeds, ranks
from .predict import predict


def lower(graph: Graph, staleness: Report, timings: dict[str, float] | None = None) -> Plan:
    weights = {n.name: transports.choose(graph.spec, n.name) for n in graph.of_role("exporter")}
    runs = {(n, r): Task("run", n, f"{graph.nodes[n].pool}.{r}", r, role=graph.nodes[n].role)
            for n in graph.topo for r in ranks(graph, n)}
    deps: dict[Task, list[Task]] = {t: [] for t in runs.values()}
    channels: list[Channel] = []
    for e in graph.edges:
        for r in ranks(graph, e.dst):
            producers = [runs[(e.src, q)] for q in feeds(graph, e, r)]
            consumer = runs[(e.dst, r)]
            if e.delay == 0:
                deps[consumer] += producers
                target = consumer
            else:
                target = Task("stash", e.dst, consumer.actor, r, e, role=graph.nodes[e.dst].role)
                deps[target] = producers + [consumer]
            for p in producers:
                channels.append(Channel(p, target, e, _transport(graph.spec, weights, p.actor, target.actor, e)))
    order = _global_order(graph, deps)
    actors = actors_of(graph)
    per_actor = {a: [t for t in order if t.actor == a] for a in actors}
    firing = Firing(graph, graph.spec.schedule.iterations)
    plan = Plan(graph=graph, actors=actors, order=per_actor, tasks=order, deps=deps, channels=channels,
                fill=firing.fill, steps=firing.steps, iterations=graph.spec.schedule.iterations,
                staleness=staleness, weights=weights, warnings=list(graph.warnings))
    plan.groups = _groups(plan)
    plan.dtypes = _dtypes(graph)
    plan.prediction = predict(plan, timings)
    return plan


def _dtypes(graph: Graph) -> dict[str, Precision]:
    """``model.dtype: auto`` on each pool that runs the model: decided now for a CPU pool of this machine
    (from its ``/proc/cpuinfo``), left to the actors for a GPU pool or a remote cluster's (:mod:`..precision`)."""
    spec = graph.spec
    if spec.model.dtype != "auto":
        return {}
    pools = dict.fromkeys(n.pool for n in graph.nodes.values()
                          if n.kind == "custom" or plugins.backend(n.kind, n.backend).uses_model)
    flags = cpu_flags()
    here = spec.runtime.address is None
    return {p: resolve("auto", "cuda" if spec.pools[p].gpus > 0 else "cpu", flags=flags,
                       decide_here=here and spec.pools[p].gpus <= 0) for p in pools}


def actors_of(graph: Graph) -> dict[str, Actor]:
    out = {}
    for pool, p in graph.spec.pools.items():
        if not any(n.pool == pool for n in graph.nodes.values()):
            continue
        for r in range(p.actors):
            out[f"{pool}.{r}"] = Actor(f"{pool}.{r}", pool, r, p.cpus, p.gpus)
    return out


def _global_order(graph: Graph, deps: dict[Task, list[Task]]) -> list[Task]:
    """Kahn's algorithm; among ready tasks: runs before stashes, then graph order, then rank."""
    pos = {n: i for i, n in enumerate(graph.topo)}
    indeg = {t: len(set(d)) for t, d in deps.items()}
    users: dict[Task, set[Task]] = {t: set() for t in deps}
    for t, ds in deps.items():
        for d in set(ds):
            users[d].add(t)

    def prio(t: Task) -> tuple:
        return (t.op != "run", pos[t.node], t.rank, t.edge.index if t.edge else -1)

    heap = [(prio(t), i, t) for i, t in enumerate(deps) if indeg[t] == 0]
    heapq.heapify(heap)
    out: list[Task] = []
    counter = len(heap)
    while heap:
        _, _, t = heapq.heappop(heap)
        out.append(t)
        for u in users[t]:
            indeg[u] -= 1
            if indeg[u] == 0:
                counter += 1
                heapq.heappush(heap, (prio(u), counter, u))
    assert len(out) == len(deps), "task graph has a cycle: validation should have caught it"
    return out


def _transport(spec, weights: dict[str, str], src_actor: str, dst_actor: str, e: Edge) -> str:
    if src_actor == dst_actor:
        return "local"
    if e.state and e.src in weights:
        return weights[e.src]
    return transports.choose_data(spec, e.transport, spec.edges[e.index].arrow)


def _groups(plan: Plan) -> list[Group]:
    out: list[Group] = []
    for node, path in plan.weights.items():
        if path != "nccl":
            continue
        members = [plan.tasks_of(node)[0].actor]
        for c in plan.channels:
            if c.edge.state and c.edge.src == node and c.dst.actor != members[0] and c.dst.actor not in members:
                members.append(c.dst.actor)
        out.append(Group(transports.weights_group(node), tuple(members), "nccl", "weights"))
    spec = plan.graph.spec
    for n in plan.graph.of_role("trainer"):
        pool = spec.pools[n.pool]
        sharded = pool.sharding != "none"       # a mesh even of one rank: fully_shard needs its group
        if (pool.actors > 1 or sharded) and plugins.backend(n.kind, n.backend).data_parallel:
            members = tuple(a for a, x in plan.actors.items() if x.pool == n.pool)
            out.append(Group(transports.pool_group(n.pool), members, transports.pool_backend(pool.gpus),
                             "sharded" if sharded else "data-parallel"))
    return out
