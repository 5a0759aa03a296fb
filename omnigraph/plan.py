"""The plan: the validated graph lowered onto actors, ready for any executor.

Lowering rules (DESIGN.md, "Lowering onto Ray Compiled Graphs"):

- every pool becomes ``actors`` actors named ``<pool>.<rank>``;
- a node runs on every actor of its pool (its data-parallel ranks), except
  ``sync``, which exports once, from rank 0;
- a zero-delay edge between actors is a channel (``shm``: batches are host
  tensors), within an actor a plain local value; weights from ``sync`` go
  ``nccl`` between whole GPUs (a torch.distributed group carries the bytes,
  the channel their description: :mod:`omnigraph.weightsync`) or
  ``cuda-ipc`` between pools sharing a card;
- a delayed edge is a FIFO buffer held inside the consumer's actor: the
  consumer's ``run`` pops the value of ``t - d`` and a later ``stash`` task on
  the same actor stores this step's value. For weights the stash is the
  ``apply`` task on each rollout actor;
- each actor's task order is its projection of one global topological order
  of the tasks (runs before stashes), so no two actors can wait on each other.

One plan, several executors (``local``, ``ray``, ``ray-tasks``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .ir import Edge, Graph
from .predict import Prediction, predict
from .schedule import Firing
from .staleness import Report


@dataclass(frozen=True)
class Actor:
    name: str
    pool: str
    rank: int
    cpus: float
    gpus: float


@dataclass(frozen=True)
class Task:
    op: str                   # "run" or "stash"
    node: str                 # the node run, or the consumer that stores the value
    actor: str
    rank: int
    edge: Edge | None = None  # the delayed or state edge a stash stores
    kind: str = ""            # the kind of ``node``

    @property
    def label(self) -> str:
        if self.op == "run":
            return f"export {self.node}" if self.kind == "sync" else self.node
        e = self.edge
        verb = "apply" if e.state else "stash"
        return f"{verb} {e.src}->{e.dst}.{e.dst_port}"

    @property
    def key(self) -> str:
        return f"{self.op}:{self.label}@{self.actor}"


@dataclass(frozen=True)
class Channel:
    src: Task
    dst: Task
    edge: Edge
    transport: str            # "local", "shm", "nccl" or "cuda-ipc" (weights between pools sharing a GPU)


@dataclass
class Plan:
    graph: Graph
    actors: dict[str, Actor]
    order: dict[str, list[Task]]
    tasks: list[Task]         # the global order; ``order`` is its projection per actor
    deps: dict[Task, list[Task]]
    channels: list[Channel]
    fill: int
    steps: int
    iterations: int
    staleness: Report
    prediction: Prediction | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def bound(self) -> int:
        return self.staleness.bound

    def tasks_of(self, node: str) -> list[Task]:
        """The run tasks of ``node``, one per rank (the executors ask this on every step)."""
        if not hasattr(self, "_runs"):
            self._runs: dict[str, list[Task]] = {}
            for t in self.tasks:
                if t.op == "run":
                    self._runs.setdefault(t.node, []).append(t)
        return self._runs.get(node, [])

    def producers(self, edge: Edge, rank: int) -> list[Task]:
        """The producer tasks whose values rank ``rank`` of ``edge.dst`` receives (see :func:`feeds`)."""
        runs = self.tasks_of(edge.src)
        return [runs[q] for q in feeds(self.graph, edge, rank)]

    def firing(self) -> Firing:
        return Firing(self.graph, self.iterations)

    def __str__(self) -> str:
        from .printing import format_plan
        return format_plan(self)


def actors_of(graph: Graph) -> dict[str, Actor]:
    out = {}
    for pool, p in graph.spec.pools.items():
        if not any(n.pool == pool for n in graph.nodes.values()):
            continue
        for r in range(p.actors):
            out[f"{pool}.{r}"] = Actor(f"{pool}.{r}", pool, r, p.cpus, p.gpus)
    return out


def _ranks(graph: Graph, node: str) -> range:
    n = graph.nodes[node]
    return range(1) if n.kind == "sync" else range(graph.spec.pools[n.pool].actors)


def aligned(graph: Graph, e: Edge) -> bool:
    """Rank r of the consumer takes rank r's value: a stream between nodes on the same data-parallel pool."""
    a, b = graph.nodes[e.src], graph.nodes[e.dst]
    return not e.state and a.pool == b.pool and "sync" not in (a.kind, b.kind)


def feeds(graph: Graph, e: Edge, rank: int) -> list[int]:
    """Producer ranks that feed consumer rank ``rank``: weights come from rank 0 (identical on every
    data-parallel rank), aligned streams from the same rank, other streams from every rank (gathered,
    then re-sharded for the consumer)."""
    if e.state:
        return [0]
    if aligned(graph, e):
        return [rank]
    return list(_ranks(graph, e.src))


def lower(graph: Graph, staleness: Report, timings: dict[str, float] | None = None) -> Plan:
    runs = {(n, r): Task("run", n, f"{graph.nodes[n].pool}.{r}", r, kind=graph.nodes[n].kind)
            for n in graph.topo for r in _ranks(graph, n)}
    deps: dict[Task, list[Task]] = {t: [] for t in runs.values()}
    channels: list[Channel] = []
    for e in graph.edges:
        for r in _ranks(graph, e.dst):
            producers = [runs[(e.src, q)] for q in feeds(graph, e, r)]
            consumer = runs[(e.dst, r)]
            if e.delay == 0:
                deps[consumer] += producers
                target = consumer
            else:
                target = Task("stash", e.dst, consumer.actor, r, e, kind=graph.nodes[e.dst].kind)
                deps[target] = producers + [consumer]
            for p in producers:
                channels.append(Channel(p, target, e, _transport(graph, p.actor, target.actor, e)))
    order = _global_order(graph, deps)
    actors = actors_of(graph)
    per_actor = {a: [t for t in order if t.actor == a] for a in actors}
    firing = Firing(graph, graph.spec.schedule.iterations)
    plan = Plan(graph=graph, actors=actors, order=per_actor, tasks=order,
                deps=deps, channels=channels, fill=firing.fill,
                steps=firing.steps, iterations=graph.spec.schedule.iterations, staleness=staleness,
                warnings=list(graph.warnings))
    plan.prediction = predict(plan, timings)
    return plan


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


def _transport(graph: Graph, src_actor: str, dst_actor: str, e: Edge) -> str:
    if src_actor == dst_actor:
        return "local"
    if e.transport != "auto":
        return e.transport
    src = graph.nodes[e.src]
    if e.state and src.kind == "sync" and getattr(src.spec, "backend", "") == "torch":
        # the sync node's own choice (omnigraph.weightsync): nccl = a torch.distributed group carries the
        # bytes and the channel only their description; cuda-ipc = only a handle crosses
        from .weightsync import choose_path
        path = choose_path(graph.spec, e.src)
        return path if path in ("nccl", "cuda-ipc") else "shm"
    pools = graph.spec.pools
    gpu = [pools[a.rsplit(".", 1)[0]].gpus for a in (src_actor, dst_actor)]
    if e.state and all(0 < g < 1 for g in gpu) and not graph.spec.runtime.address:
        return "cuda-ipc"       # weights between pools sharing a card: only a handle crosses (omnigraph.tensors)
    return "shm"                # batches are host tensors: shared memory (or the object store), also between GPUs
