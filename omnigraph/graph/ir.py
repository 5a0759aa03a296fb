"""The resolved graph: nodes with their roles and ports, edges with ports, types and delays.

``validate.resolve(spec)`` builds it from a :class:`~omnigraph.graph.spec.GraphSpec`;
everything after validation (staleness analysis, plan, executors) reads this
and never the raw spec fields that mode sugar may have changed. The compiler
reasons about a node's ``role`` (generator, scorer, logprob, trainer,
exporter, transform), never about its backend.

``str(graph)`` prints it like code::

    graph grpo (mode one_step_off)
      generate: generate[hf] @rollout (generator)
      ...
      reward.batch -> old_logprob.batch  [Batch, delay 1]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .ports import is_state
from ..sdk import Lora, PolicyInfo


@dataclass(frozen=True)
class Node:
    name: str
    kind: str
    role: str
    backend: str
    pool: str
    inputs: dict[str, str]
    outputs: dict[str, str]
    every: int = 1
    spans: int = 1
    """Firings (weight versions) one of this generator's samples may span: ``partial.max_spans``, else 1."""
    spec: Any = field(default=None, compare=False, repr=False)
    backend_options: Any = field(default=None, compare=False, repr=False)
    """The backend's own options (the node's ``options:``), validated against its descriptor's model by the
    compiler (:func:`omnigraph.plugins.typed_options`); None where the backend declares none."""


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
    data: dict[str, Any] | None = None
    """Prompts from data (``task.source``): what the compiler read (source, fingerprint, rows, filtered)."""

    def inputs_of(self, node: str) -> list[Edge]:
        return [e for e in self.edges if e.dst == node]

    def outputs_of(self, node: str) -> list[Edge]:
        return [e for e in self.edges if e.src == node]

    def of_role(self, role: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == role]

    @property
    def trainer(self) -> Node:
        """The one node whose role is the trainer step (validation checks there is exactly one)."""
        return self.of_role("trainer")[0]

    def is_source(self, node: str) -> bool:
        """Fires once per iteration on its own: a generator, or a node with no inputs at all."""
        return self.nodes[node].role == "generator" or not self.inputs_of(node)

    def stream_inputs(self, node: str) -> list[Edge]:
        return [e for e in self.inputs_of(node) if not e.state]

    @property
    def policy(self) -> PolicyInfo:
        """The trainer settings several nodes need (the generators mirror LoRA; old_logprob fuses with a
        one-step update; the update takes the reference's KL coefficient)."""
        opts = self.trainer.spec if self.of_role("trainer") else None
        lora = getattr(opts, "lora", None)
        kl = next((getattr(n.spec, "kl_coef", 0.0) for n in self.nodes.values() if n.kind == "ref_logprob"), 0.0)
        return PolicyInfo(
            lora=Lora(lora.r, lora.alpha, tuple(lora.target_modules)) if lora is not None else None,
            lr=getattr(opts, "lr", 1e-3), weight_decay=getattr(opts, "weight_decay", 0.0),
            mini_batch_size=getattr(opts, "mini_batch_size", None), kl_coef=kl)

    def __str__(self) -> str:
        s = self.spec.schedule
        lines = [f"graph {self.name} (mode {s.mode})"]
        for n in self.nodes.values():
            rate = f" every {n.every}" if n.every > 1 else ""
            lines.append(f"  {n.name}: {n.kind}[{n.backend}] @{n.pool}{rate} ({n.role})")
        for e in self.edges:
            lines.append(f"  {e}")
        return "\n".join(lines)
