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
``ctx.log(key=value)`` adds scalars to the step's metrics. ``ctx.device`` is
where the node computes: ``cuda`` when its pool has ``gpus > 0``, else ``cpu``.

Built-in kinds and backends are found by :func:`nodes.registry.make_node`;
``kind: custom`` nodes name their class by dotted path (``cls: pkg.mod:Class``).
"""

from __future__ import annotations

import os
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
    def pool(self) -> str:
        """The pool of this actor (actors are named ``pool.rank``)."""
        return self.actor.rsplit(".", 1)[0]

    @property
    def device(self) -> str:
        """``cuda`` when this actor's pool asks for GPUs, else ``cpu``.

        Inside a Ray actor with ``num_gpus`` set, Ray's ``CUDA_VISIBLE_DEVICES`` makes ``cuda`` the
        card (or the share of a card) Ray gave the actor. A pool with ``gpus > 0`` on a machine
        without CUDA is an error, never a silent fallback to the CPU.
        """
        gpus = self.spec.pools[self.pool].gpus
        if gpus <= 0:
            return "cpu"
        import torch
        if not torch.cuda.is_available():
            from .errors import GraphError
            raise GraphError(f"asks for {gpus:g} GPU(s) per actor but CUDA is not available here "
                             f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                             f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!s})",
                             where=f"pools.{self.pool}.gpus",
                             fix=f"set pools.{self.pool}.gpus=0 to run on the CPU, or run on a machine with "
                                 "a CUDA GPU and a CUDA build of torch")
        return "cuda"

    @property
    def task(self):
        if "task" not in self.state.store:
            from nodes.tasks import make_task
            self.state.store["task"] = make_task(self.spec.task)
        return self.state.store["task"]


class NodeImpl(Protocol):
    def __init__(self, name: str, spec: Any, ctx: NodeContext) -> None: ...

    def __call__(self, step: int, **inputs: Any) -> dict[str, Any]: ...
