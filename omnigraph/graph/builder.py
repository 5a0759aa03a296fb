"""The Python builder: the same graphs as YAML, written in code.

>>> import omnigraph as og
>>> g = og.Graph("grpo")
>>> g.pool("rollout"); g.pool("trainer")
>>> gen = g.node("generate", kind="generate", pool="rollout", backend="synthetic")
>>> rew = g.node("reward", kind="reward", pool="rollout")
>>> olp = g.node("old_logprob", kind="old_logprob", pool="trainer")
>>> upd = g.node("update", kind="update", pool="trainer")
>>> syn = g.node("sync", kind="sync", pool="trainer")
>>> g.chain(gen, rew); g.edge(rew, olp, delay=1); g.chain(olp, upd, syn); g.edge(syn, gen, delay=1)
>>> g.schedule(mode="one_step_off")
>>> print(g.to_yaml().splitlines()[0])
name: grpo

``Graph.from_yaml(text).to_yaml()`` gives back the same spec (the round trip
is a property test).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import GraphError
from .spec import EdgeSpec, GraphSpec
from .yamlio import dump, load_text, validate_raw


@dataclass(frozen=True)
class NodeRef:
    """A handle on a node; ``ref["port"]`` names one of its ports for an edge."""

    name: str
    port: str | None = None

    def __getitem__(self, port: str) -> "NodeRef":
        return NodeRef(self.name, port)

    def __str__(self) -> str:
        return f"{self.name}.{self.port}" if self.port else self.name


class Graph:
    """A mutable graph under construction; ``og.compile(g)`` validates and plans it."""

    def __init__(self, name: str = "omnigraph", **sections: Any):
        self._raw: dict[str, Any] = {"name": name, "pools": {}, "nodes": {}, "edges": []}
        for key, value in sections.items():
            self._raw[key] = value

    # -- sections -------------------------------------------------------
    def pool(self, name: str, **fields: Any) -> None:
        self._raw["pools"][name] = fields

    def node(self, name: str, **fields: Any) -> NodeRef:
        if name in self._raw["nodes"]:
            raise GraphError(f"node '{name}' is defined twice", where=f"nodes.{name}", fix="give each node its own name")
        self._raw["nodes"][name] = fields
        return NodeRef(name)

    def edge(self, src: NodeRef | str, dst: NodeRef | str, *, delay: int | None = None,
             transport: str = "auto") -> None:
        attrs: dict[str, Any] = {}
        if delay is not None:
            attrs["delay"] = delay
        if transport != "auto":
            attrs["transport"] = transport
        arrow = f"{src} -> {dst}"
        self._raw["edges"].append({arrow: attrs} if attrs else arrow)

    def chain(self, *refs: NodeRef | str) -> None:
        """Zero-delay edges along ``refs``: ``g.chain(a, b, c)`` is a -> b -> c."""
        for a, b in zip(refs, refs[1:]):
            self.edge(a, b)

    def set(self, section: str, **fields: Any) -> None:
        """Set the fields of a section: ``model``, ``task``, ``schedule``, ``runtime`` or ``checkpoint``."""
        self._raw.setdefault(section, {}).update(fields)

    def schedule(self, **fields: Any) -> None:
        self.set("schedule", **fields)

    def model(self, **fields: Any) -> None:
        self.set("model", **fields)

    def task(self, **fields: Any) -> None:
        self.set("task", **fields)

    # -- conversions ----------------------------------------------------
    def to_spec(self) -> GraphSpec:
        return validate_raw(self._raw, source=f"graph '{self._raw['name']}'")

    def to_yaml(self) -> str:
        return dump(self.to_spec())

    @classmethod
    def from_spec(cls, spec: GraphSpec) -> "Graph":
        g = cls(spec.name)
        fields = spec.model_dump(mode="json", exclude_unset=True)
        for section in ("model", "task", "schedule", "runtime", "checkpoint"):
            if section in fields:
                g.set(section, **fields[section])
        for name, pool in spec.pools.items():
            g.pool(name, **pool.model_dump(exclude_unset=True))
        for name, node in spec.nodes.items():
            g.node(name, **{"kind": node.kind, "pool": node.pool, **node.model_dump(exclude_unset=True)})
        for e in spec.edges:
            g._raw["edges"].append(EdgeSpec.model_dump(e))
        return g

    @classmethod
    def from_yaml(cls, text: str) -> "Graph":
        return cls.from_spec(load_text(text))

    def __repr__(self) -> str:
        r = self._raw
        return f"Graph({r['name']!r}, nodes={list(r['nodes'])}, edges={len(r['edges'])})"
