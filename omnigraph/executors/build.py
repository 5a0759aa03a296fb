"""Building nodes for an actor: their :class:`~omnigraph.sdk.NodeContext` and their classes, found through
the plugin registry (``omnigraph.backends``; ``kind: custom`` by dotted path)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from .. import plugins
from ..errors import GraphError
from ..planning.precision import Precision, resolve
from ..sdk import ModelInfo, NodeContext, Prompt, RunInfo


def device_of(spec, pool: str) -> str:
    """``cuda`` when the pool asks for GPUs, else ``cpu``. Inside a Ray actor with ``num_gpus`` set, Ray's
    ``CUDA_VISIBLE_DEVICES`` makes ``cuda`` the card (or the share of a card) Ray gave the actor. A pool with
    ``gpus > 0`` on a machine without CUDA is an error, never a silent fallback to the CPU."""
    gpus = spec.pools[pool].gpus
    if gpus <= 0:
        return "cpu"
    import torch                      # heavy: only GPU pools pay for it here
    if not torch.cuda.is_available():
        raise GraphError(f"asks for {gpus:g} GPU(s) per actor but CUDA is not available here "
                         f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!s})", where=f"pools.{pool}.gpus",
                         fix=f"set pools.{pool}.gpus=0 to run on the CPU, or run on a machine with a CUDA GPU "
                             "and a CUDA build of torch")
    return "cuda"


def context(plan, node: str, actor: str, shared: dict, faults=None) -> NodeContext:
    """The context of ``node`` when it runs on ``actor`` (its own pool's actor, or the trainer's for a
    regeneration)."""
    g = plan.graph
    spec = g.spec
    a = plan.actors[actor]
    n = g.nodes[node]
    model = ModelInfo(spec.model.path, model_dtype(plan, actor), spec.model.seed, freeze=tuple(spec.model.freeze))
    model.resolve = lambda: Path(plugins.model_dir(spec.model.path, spec.model.seed, log=lambda _: None))
    return NodeContext(name=node, kind=n.kind, options=n.spec, model=model, policy=g.policy,
                       run=RunInfo(spec.task.prompts, spec.task.samples_per_prompt, spec.schedule.iterations,
                                   spec.runtime.seed),
                       actor=actor, rank=a.rank, world=spec.pools[a.pool].actors, device=device_of(spec, a.pool),
                       shared=shared, faults=faults, sharding=spec.pools[a.pool].sharding,
                       backend_options=n.backend_options)


_decided: dict[str, Precision] = {}
"""``model.dtype: auto`` as decided in this process, per device (``cpu``, ``cuda``)."""
_said: set[str] = set()


def model_dtype(plan, actor: str) -> str:
    """``model.dtype`` on ``actor``'s pool: as written, as the plan decided (``auto`` on a CPU pool of this
    machine), or decided here, on the pool's own hardware (a GPU pool, a remote cluster's pool)."""
    spec = plan.graph.spec
    pool = plan.actors[actor].pool
    if spec.model.dtype != "auto":
        return spec.model.dtype
    planned = plan.dtypes.get(pool)
    if planned is not None and planned.dtype is not None:
        return planned.dtype
    device = device_of(spec, pool)
    if device not in _decided:
        _decided[device] = resolve("auto", device)
    p = _decided[device]
    if planned is not None and actor not in _said:     # an actor that runs the model says what it chose
        _said.add(actor)
        print(f"{actor}: model.dtype {p.line(pool)}", flush=True)
    return p.dtype


def node_class(node):
    """The class implementing ``node`` (an ``ir.Node``)."""
    if node.kind == "custom":
        return plugins.load_dotted(node.spec.cls, where=f"nodes.{node.name}.cls")
    backend = plugins.backend(node.kind, node.backend, where=f"nodes.{node.name}.backend")
    return plugins.load_dotted(backend.impl, where=f"nodes.{node.name}.backend")


def task_of(spec, log=lambda _: None):
    """The task (prompt source) of the graph (:func:`omnigraph.plugins.make_task`)."""
    return plugins.make_task(spec, log)


def step_prompts(task, step: int, n: int, world: int = 1, rank: int = 0) -> list[Prompt]:
    """The ``n`` prompts of ``step`` numbered as prompt groups ``step * n + i``; rank ``rank``'s share of
    ``world`` equal shares."""
    every = task.batch(step)
    if len(every) != n:
        raise GraphError(f"the task gave {len(every)} prompts for step {step}, not task.prompts = {n}",
                         where="task.name", fix="a task's batch(step) must return task.prompts prompts")
    every = [dataclasses.replace(p, group=step * n + i) for i, p in enumerate(every)]
    per = n // world
    return every[rank * per:(rank + 1) * per]
