"""What a node implementation is, and what it is given.

A node is a class built once per actor rank and called once per firing::

    class MyReward:
        def __init__(self, name: str, spec, ctx: NodeContext): ...
        def __call__(self, step: int, **inputs) -> dict[str, Any]:   # port -> value
            ...

``__init__`` runs when the actor starts (load models there); ``__call__`` runs
each step the node fires, with one keyword per input port, and returns one
value per output port. Nodes on the same actor share ``ctx.state`` (e.g. the
trainer's model, read by ``old_logprob`` and written by ``update``).
``ctx.log(key=value)`` adds scalars to the step's metrics.

Built-in kinds and backends are found by :func:`nodes.registry.make_node`;
``kind: custom`` nodes name their class by dotted path (``cls: pkg.mod:Class``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class ActorState:
    """What the nodes of one actor share."""

    policy_version: int = 0
    """Updates done by this actor's trainer (trainer actors only)."""
    store: dict[str, Any] = field(default_factory=dict)
    """Free-form shared objects: the model, the optimizer, caches."""


@dataclass
class NodeContext:
    actor: str
    rank: int
    world: int
    seed: int
    spec: Any                      # the whole GraphSpec
    state: ActorState
    metrics: dict[str, float] = field(default_factory=dict)

    def log(self, **scalars: float) -> None:
        self.metrics.update({k: float(v) for k, v in scalars.items()})

    @property
    def task(self):
        if "task" not in self.state.store:
            from nodes.tasks import make_task
            self.state.store["task"] = make_task(self.spec.task)
        return self.state.store["task"]


class NodeImpl(Protocol):
    def __init__(self, name: str, spec: Any, ctx: NodeContext) -> None: ...

    def __call__(self, step: int, **inputs: Any) -> dict[str, Any]: ...
