"""The plan: the validated graph lowered onto actors, ready for any executor.

A :class:`Plan` holds, and ``print(plan)`` shows (:mod:`.printer`): every
actor and its tasks in order, the channels between actors and the delay
buffers inside them, the weights path of every exporter, the process groups
the executor forms before step 0, the model's dtype on each pool (``auto``
resolved), the pipeline fill and drain, the proven staleness bound and a
predicted step time. One plan, several executors
(``local``, ``ray``, ``ray-tasks``): nothing here knows which one runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..graph.ir import Edge, Graph
from .precision import Precision
from ..proof.schedule import Firing
from ..proof.staleness import Report
from .predict import Prediction
from .printer import format_plan


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
    role: str = ""            # the role of ``node``

    @property
    def label(self) -> str:
        if self.op == "run":
            return f"export {self.node}" if self.role == "exporter" else self.node
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
    transport: str
    """``local`` (same actor); for data ``shm`` (or ``nccl`` when the edge asks); for weights the exporter's
    weights path (``Plan.weights``)."""


@dataclass(frozen=True)
class Group:
    """A torch.distributed process group the executor forms before step 0."""

    name: str
    members: tuple[str, ...]
    """Actors in rank order (for weights: the sender first)."""
    backend: str            # nccl | gloo
    purpose: str            # weights | data-parallel | sharded


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
    weights: dict[str, str] = field(default_factory=dict)
    """Exporter node -> the weights path chosen for it, once (:func:`omnigraph.transports.choose`)."""
    groups: list[Group] = field(default_factory=list)
    prediction: Prediction | None = None
    warnings: list[str] = field(default_factory=list)
    dtypes: dict[str, Precision] = field(default_factory=dict)
    lend: dict[str, Any] | None = None
    """``schedule.lend``'s decision (:mod:`.lend`): the idle time predicted and the prompts lent; None when off."""
    source: Any = None
    """The spec as given, before the planner rewrote it (``schedule.lend`` adds nodes): what a run's
    ``config.yaml`` keeps, so that compiling it again (``--resume``, ``plan --timings``) plans the same graph."""
    """``model.dtype: auto`` on every pool that runs the model (empty for an explicit dtype)."""

    def __post_init__(self) -> None:
        self._runs: dict[str, list[Task]] = {}
        for t in self.tasks:
            if t.op == "run":
                self._runs.setdefault(t.node, []).append(t)

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def bound(self) -> int:
        return self.staleness.bound

    @property
    def executor(self) -> str:
        return self.graph.spec.runtime.executor

    def tasks_of(self, node: str) -> list[Task]:
        """The run tasks of ``node``, one per rank (the executors ask this on every step)."""
        return self._runs.get(node, [])

    def producers(self, edge: Edge, rank: int) -> list[Task]:
        """The producer tasks whose values rank ``rank`` of ``edge.dst`` receives (see :func:`feeds`)."""
        runs = self.tasks_of(edge.src)
        return [runs[q] for q in feeds(self.graph, edge, rank)]

    def firing(self) -> Firing:
        return Firing(self.graph, self.iterations)

    def __str__(self) -> str:
        return format_plan(self)


def ranks(graph: Graph, node: str) -> range:
    """The ranks a node runs on: every actor of its pool, except an exporter, which sends once from rank 0
    (on a sharded pool every rank runs it: the weights are gathered from every rank's shard, then sent)."""
    n = graph.nodes[node]
    pool = graph.spec.pools[n.pool]
    return range(1) if n.role == "exporter" and pool.sharding == "none" else range(pool.actors)


def aligned(graph: Graph, e: Edge) -> bool:
    """Rank r of the consumer takes rank r's value: a stream between nodes on the same data-parallel pool."""
    a, b = graph.nodes[e.src], graph.nodes[e.dst]
    return not e.state and a.pool == b.pool and "exporter" not in (a.role, b.role)


def feeds(graph: Graph, e: Edge, rank: int) -> list[int]:
    """Producer ranks that feed consumer rank ``rank``: weights come from rank 0 (identical on every
    data-parallel rank), aligned streams from the same rank, other streams from every rank (gathered,
    then re-sharded for the consumer). On a sharded pool each rank's exporter takes its own rank's weights."""
    if e.state:
        a, b = graph.nodes[e.src], graph.nodes[e.dst]
        same = a.pool == b.pool and graph.spec.pools[a.pool].sharding != "none"
        return [rank] if same else [0]
    if aligned(graph, e):
        return [rank]
    return list(ranks(graph, e.src))
