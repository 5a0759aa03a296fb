"""When nodes fire, and how delayed values wait: the two rules every executor shares.

**Firing.** Step ``t`` (0-based) of a run of ``iterations`` training steps:

- a *source* (``generate``, or a node without inputs) fires while ``t < iterations``;
- a node with stream inputs fires when every stream producer fired at ``t - delay``;
- a node whose inputs are all state (``sync``) is *ready* when a state producer
  fired at ``t - delay``, and fires on every ``every``-th ready step.

The first ``fill`` steps only fill the delay buffers (the warm-up batches);
the last ``fill`` steps drain them, so a run has ``iterations + fill`` steps
and every generated batch is trained exactly once.

>>> from omnigraph.testing import canonical_graph
>>> f = Firing(canonical_graph("one_step_off"), iterations=2)
>>> [sorted(f.next()) for _ in range(f.steps)]
[['generate', 'reward'], ['generate', 'old_logprob', 'reward', 'sync', 'update'], ['old_logprob', 'sync', 'update']]

**Delay lines.** A value crossing an edge with delay ``d`` is consumed ``d``
steps after it was produced. Streams are FIFO (each value read once); state
(weights) is sample-and-hold: a reader sees the newest value produced at or
before ``t - d``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import networkx as nx

from ..graph.ir import Graph


def arrival(nodes, edges) -> dict[str, int]:
    """Per node: how many steps after its source the batch it consumes was generated (the sum of stream
    delays on the way, every stream edge, delayed ones too). The stream inputs of a node must agree
    (validation checks it), or it would join batches of different steps."""
    stream = nx.DiGraph()
    stream.add_nodes_from(nodes)
    stream.add_edges_from((e.src, e.dst) for e in edges if not e.state)
    depth: dict[str, int] = {}
    for name in nx.topological_sort(stream):
        ins = [e for e in edges if e.dst == name and not e.state]
        depth[name] = max((depth[e.src] + e.delay for e in ins), default=0)
    return depth


def fill_depth(graph: Graph) -> dict[str, int]:
    """Per node: the steps of pipeline fill before it first fires."""
    return arrival(graph.nodes, graph.edges)


class Firing:
    """The static firing table, produced one step at a time (a run can have millions of steps)."""

    def __init__(self, graph: Graph, iterations: int):
        self.graph = graph
        self.iterations = iterations
        self.fill = max(fill_depth(graph).values(), default=0)
        self.steps = iterations + self.fill
        self.t = 0
        self._order = graph.topo
        self._keep = 1 + max((e.delay for e in graph.edges), default=0)
        self._past: deque[frozenset[str]] = deque(maxlen=self._keep)
        self._ready = {n: 0 for n in graph.nodes}

    def fired(self, node: str, t: int) -> bool:
        """Did ``node`` fire at past step ``t`` (within the longest delay)?"""
        if t < 0:
            return False
        back = self.t - t
        if back < 1 or back > len(self._past):
            raise IndexError(f"step {t} is not in the remembered window of step {self.t}")
        return node in self._past[-back]

    def next(self) -> frozenset[str]:
        t, g = self.t, self.graph
        now: set[str] = set()

        def did(src: str, d: int) -> bool:
            return src in now if d == 0 else self.fired(src, t - d)

        for name in self._order:
            node = g.nodes[name]
            stream = g.stream_inputs(name)
            if g.is_source(name):
                ready = t < self.iterations
            elif stream:
                ready = all(did(e.src, e.delay) for e in stream)
            else:
                ready = any(did(e.src, e.delay) for e in g.inputs_of(name))
            if ready:
                self._ready[name] += 1
                if stream or self._ready[name] % node.every == 0:
                    now.add(name)
        fired = frozenset(now)
        self._past.append(fired)
        self.t += 1
        return fired


class DelayLine:
    """The buffer of one edge inside its consumer: FIFO for streams, newest-wins for state."""

    def __init__(self, delay: int, state: bool, initial: Any = None):
        self.delay = delay
        self.state = state
        self.current = initial
        self.queue: deque[tuple[int, Any]] = deque()

    def push(self, t: int, value: Any) -> None:
        """Store what the producer made at step ``t`` (call only when it fired)."""
        self.queue.append((t, value))

    def read(self, t: int) -> Any:
        """The value for a consumer firing at step ``t``."""
        due = t - self.delay
        if self.state:
            while self.queue and self.queue[0][0] <= due:
                self.current = self.queue.popleft()[1]
            return self.current
        if not self.queue or self.queue[0][0] != due:
            have = self.queue[0][0] if self.queue else "nothing"
            raise RuntimeError(f"delay line out of step: step {t} wants the value of step {due}, holds {have}")
        return self.queue.popleft()[1]

    def __len__(self) -> int:
        return len(self.queue)

    def snapshot(self) -> dict[str, Any]:
        return {"delay": self.delay, "state": self.state, "current": self.current, "queue": list(self.queue)}
