"""The resolved graph: nodes with their ports, edges with ports, types and delays.

``validate.resolve(spec)`` builds it from a :class:`~omnigraph.spec.GraphSpec`;
everything after validation (staleness analysis, plan, executors) reads this
and never the raw spec fields that mode sugar may have changed.

``str(graph)`` prints it like code::

    graph grpo (mode one_step_off)
      generate: generate @rollout
      ...
      reward.batch -> old_logprob.batch  [Batch, delay 1]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .ports import is_state


@dataclass(frozen=True)
class Node:
    name: str
    kind: str
    pool: str
    inputs: dict[str, str]
    outputs: dict[str, str]
    every: int = 1
    spec: Any = field(default=None, compare=False, repr=False)

    @property
    def backend(self) -> str:
        return getattr(self.spec, "backend", "custom")


@dataclass(frozen=True)
class Edge:
    src: str
    src_port: str
    dst: str
    dst_port: str
    type: str
    delay: int
    transport: str = "auto"
    index: int = 0
    """Position in the YAML ``edges`` list, for error messages."""

    @property
    def state(self) -> bool:
        return is_state(self.type)

    @property
    def arrow(self) -> str:
        return f"{self.src}.{self.src_port} -> {self.dst}.{self.dst_port}"

    def __str__(self) -> str:
        return f"{self.arrow}  [{self.type}, delay {self.delay}]"


@dataclass
class Graph:
    """A validated graph. ``nodes`` keeps YAML order; ``topo`` is a zero-delay topological order."""

    name: str
    spec: Any
    nodes: dict[str, Node]
    edges: list[Edge]
    topo: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def inputs_of(self, node: str) -> list[Edge]:
        return [e for e in self.edges if e.dst == node]

    def outputs_of(self, node: str) -> list[Edge]:
        return [e for e in self.edges if e.src == node]

    def of_kind(self, kind: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == kind]

    @property
    def update(self) -> Node:
        return self.of_kind("update")[0]

    def is_source(self, node: str) -> bool:
        """Fires once per iteration on its own: ``generate``, or a node with no inputs at all."""
        return self.nodes[node].kind == "generate" or not self.inputs_of(node)

    def stream_inputs(self, node: str) -> list[Edge]:
        return [e for e in self.inputs_of(node) if not e.state]

    def __str__(self) -> str:
        s = self.spec.schedule
        lines = [f"graph {self.name} (mode {s.mode})"]
        for n in self.nodes.values():
            rate = f" every {n.every}" if n.every > 1 else ""
            lines.append(f"  {n.name}: {n.kind}[{n.backend}] @{n.pool}{rate}")
        for e in self.edges:
            lines.append(f"  {e}")
        return "\n".join(lines)
