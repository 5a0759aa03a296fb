"""The static staleness proof: unroll the graph and follow every version.

Staleness of a trained sample = the trainer's policy version at the update
that trains it - the ``min_version`` of the weights that generated it (see
:mod:`omnigraph.graph.spec`). This module computes the exact maximum over a run by
unrolling the graph symbolically: values carry only versions, nodes only move
them (``generate`` stamps the version of the weights it holds, ``update``
measures staleness and bumps the trainer's version, ``sync`` forwards it).

A generator with partial rollouts (``spans = partial.max_spans > 1``) may
return a sample it began ``spans - 1`` firings earlier: its oldest token (its
``min_version``) carries the weights of that firing, its newest the current
ones. The unrolling stamps every output of such a generator with the oldest
version of its last ``spans`` firings, so the bound covers every token of
every sample, however the budget splits them.

After the pipeline fill the pattern repeats with the hyperperiod (the lcm of
all node rates, e.g. ``sync_every``), so a run longer than
``fill + 2 x hyperperiod`` plus the delays has the same maximum as that
prefix: we unroll ``min(iterations, horizon)`` iterations, drain included.

>>> from omnigraph.testing import canonical_graph
>>> analyse(canonical_graph("one_step_off", sync_every=4)).bound
4
>>> analyse(canonical_graph("one_step_off", spans=3)).bound    # two more firings per sample
3
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from ..graph.ir import Graph
from .schedule import DelayLine, Firing

MAX_HORIZON = 2_000_000


@dataclass(frozen=True)
class Trained:
    step: int
    batch: int          # the step that generated it
    trainer_version: int
    min_version: int
    max_version: int

    @property
    def staleness(self) -> int:
        return self.trainer_version - self.min_version


@dataclass
class Report:
    bound: int
    iterations_unrolled: int
    hyperperiod: int
    fill: int
    trained: list[Trained] = field(default_factory=list)
    generated: list[tuple[int, str, int]] = field(default_factory=list)   # (step, node, weights version)
    explanation: str = ""
    spans: int = 1
    """The most firings one sample may span (the largest ``partial.max_spans``; 1 without partial rollouts)."""
    bound_whole: int | None = None
    """With partial rollouts: the bound the same graph would have if every sample finished in its firing."""


def hyperperiod(graph: Graph) -> int:
    return math.lcm(*(n.every for n in graph.nodes.values()))


def horizon(graph: Graph) -> int:
    """Iterations that are enough to see every staleness a run of any length can have."""
    total_delay = sum(e.delay for e in graph.edges)
    return min(MAX_HORIZON, 2 * (hyperperiod(graph) + total_delay) + 8)


def analyse(graph: Graph, iterations: int | None = None, spans: bool = True) -> Report:
    """Unroll and return the exact maximum staleness (and the per-batch trace); ``spans=False``: as if no
    generator carried samples across firings."""
    if iterations is None:
        iterations = graph.spec.schedule.iterations
    unrolled = min(iterations, horizon(graph))
    firing = Firing(graph, unrolled)
    lines = {e.index: DelayLine(e.delay, e.state, initial=0 if e.state else None)
             for e in graph.edges if e.state or e.delay > 0}
    trainer_version = 0
    report = Report(bound=0, iterations_unrolled=unrolled, hyperperiod=hyperperiod(graph), fill=firing.fill,
                    spans=max((n.spans for n in graph.of_role("generator")), default=1) if spans else 1)
    window = {n.name: collections.deque(maxlen=n.spans if spans else 1) for n in graph.of_role("generator")}
    for t in range(firing.steps):
        fired = firing.next()
        out: dict[str, object] = {}
        for name in graph.topo:
            if name not in fired:
                continue
            node = graph.nodes[name]
            weights, stream = None, []
            for e in graph.inputs_of(name):
                if e.index in lines:
                    if e.delay == 0 and e.src in fired:
                        lines[e.index].push(t, out[e.src])
                    value = lines[e.index].read(t)
                else:
                    value = out[e.src]
                if e.state:
                    weights = value if weights is None else max(weights, value)
                else:
                    stream.append(value)            # several edges into one port: a join
            if node.role == "generator":
                report.generated.append((t, name, weights))
                window[name].append(weights)
                out[name] = (t, min(window[name]), weights)     # a carried sample began up to spans-1 firings ago
            elif node.role == "trainer":
                batch, lo, hi = _joined(stream)
                report.trained.append(Trained(t, batch, trainer_version, lo, hi))
                trainer_version += 1
                out[name] = trainer_version
            elif stream:
                out[name] = _joined(stream)
            else:   # state-only (sync, custom rate nodes): forward the newest version
                out[name] = weights if weights is not None else 0
        for e in graph.edges:
            if e.delay > 0 and e.src in fired:
                lines[e.index].push(t, out[e.src])
    report.bound = max((x.staleness for x in report.trained), default=0)
    report.explanation = explain(graph, spans)
    if spans and report.spans > 1:
        report.bound_whole = analyse(graph, iterations, spans=False).bound
    return report


def _joined(parts: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    """Branches of one batch: its step, the oldest and the newest version among them."""
    return parts[0][0], min(p[1] for p in parts), max(p[2] for p in parts)


def explain(graph: Graph, spans: bool = True) -> str:
    """Where the bound comes from, in words (the number itself comes from the unrolling)."""
    parts = [f"{e.src} -> {e.dst} delay {e.delay}" for e in graph.edges if e.delay > 0]
    rates = [f"{n.name} every {n.every} adds up to {n.every - 1}" for n in graph.nodes.values() if n.every > 1]
    carried = [f"{n.name} partial rollouts span up to {n.spans} firings, adds up to {n.spans - 1}"
               for n in graph.of_role("generator") if spans and n.spans > 1]
    return "; ".join(parts + rates + carried) or "no delays"
