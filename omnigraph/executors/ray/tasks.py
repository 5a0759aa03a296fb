"""The ``ray-tasks`` executor: the same plan as ordinary ``actor.method.remote()`` calls.

The baseline the benchmark compares Compiled Graphs against, and the path
forward if Compiled Graphs go away upstream. Each operation is one remote
call taking its producers' object refs; Ray resolves them, and each actor
runs its calls in submission order, which is the plan's order. Step ``t + 1``
is submitted before step ``t``'s results are read, so actors overlap as in
the compiled graph. Values cross actors through the object store, except
on the ``rdt`` path (weights, and batches on a cluster): the
producing call is submitted with Ray Direct Transport
(``tensor_transport="gloo"``) over one collective group of every actor on
either end of such a channel, formed before step 0, so the tensors go from
actor to actor and the object store holds only a reference.
"""

from __future__ import annotations

from typing import Any

import ray

from ..base import StepResult
from .common import RayExecutor



class RayTasksExecutor(RayExecutor):
    name = "ray-tasks"
    uses_waits = False
    preload_torch = False       # plain actor calls never import torch: actors of synthetic nodes start seconds sooner

    def actor_class_options(self) -> dict[str, Any]:
        return {"enable_tensor_transport": True} if self._direct() else {}

    def _direct(self) -> set[str]:
        """Nodes whose calls return their values by Ray Direct Transport: an exporter on the ``rdt`` weights
        path, a producer of a batch that crosses to another actor on ``rdt``."""
        return {c.src.node for c in self.plan.channels if c.transport == "rdt"}

    def start(self) -> None:
        super().start()
        self.direct = self._direct()
        if self.direct:
            from ray.experimental.collective import create_collective_group
            members = sorted({a for c in self.plan.channels if c.src.node in self.direct and c.transport != "local"
                              for a in (c.src.actor, c.dst.actor)})
            create_collective_group([self.actors[a] for a in members], backend="torch_gloo")
            what = " and ".join(x for x, on in (("weights", any(self.plan.weights.get(n) == "rdt" for n in self.direct)),
                                                ("batches", any(n not in self.plan.weights for n in self.direct))) if on)
            self.on_status(f"{what} by Ray Direct Transport (gloo): {', '.join(members)}")

    def _submit(self, t: int, fired: frozenset) -> list:
        inp = (t, tuple(sorted(fired)))
        refs: dict[int, Any] = {}
        last: dict[str, Any] = {}
        for op in self.ops:
            actor = self.actors[op.actor]
            call = actor.exec
            if op.kind == "run" and op.task.node in self.direct:
                call = call.options(tensor_transport="gloo")
            ref = call.remote(inp, op.id, last.get(op.actor), *(refs[p] for p in op.producers))
            refs[op.id] = last[op.actor] = ref
        return [refs[op.id] for op in self.ops if op.kind == "collect"]

    def _finish(self, t: int, fired: frozenset, refs: list) -> StepResult:
        """Step ``t``'s results (the caller, ``RayExecutor._collect``, turns Ray's errors of a dead actor and its
        timeouts into NodeFailures)."""
        if getattr(self, "driver_faults", None) is not None and self.driver_faults.plan:
            ray.wait(refs, num_returns=len(refs), timeout=self.timeout)
            self._driver_fault(t, "collect")
        results = ray.get(refs, timeout=self.timeout)
        return self.result(t, fired, results)
