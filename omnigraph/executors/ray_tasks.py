"""The ``ray-tasks`` executor: the same plan as ordinary ``actor.method.remote()`` calls.

The baseline the benchmark compares Compiled Graphs against, and the path
forward if Compiled Graphs go away upstream. Each operation is one remote
call taking its producers' object refs; Ray resolves them, and each actor
runs its calls in submission order, which is the plan's order. Step ``t + 1``
is submitted before step ``t``'s results are read, so actors overlap as in
the compiled graph. Values cross actors through the object store.
"""

from __future__ import annotations

from typing import Any

import ray

from .base import StepResult
from .ray_common import RayExecutor



class RayTasksExecutor(RayExecutor):
    name = "ray-tasks"
    uses_waits = False
    preload_torch = False       # plain actor calls never import torch: actors of synthetic nodes start seconds sooner

    def _submit(self, t: int, fired: frozenset) -> list:
        inp = (t, tuple(sorted(fired)))
        refs: dict[int, Any] = {}
        last: dict[str, Any] = {}
        for op in self.ops:
            actor = self.actors[op.actor]
            ref = actor.exec.remote(inp, op.id, last.get(op.actor), *(refs[p] for p in op.producers))
            refs[op.id] = last[op.actor] = ref
        return [refs[op.id] for op in self.ops if op.kind == "collect"]

    def _finish(self, t: int, fired: frozenset, refs: list) -> StepResult:
        try:
            results = ray.get(refs, timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            raise self.hung(t) from None
        except ray.exceptions.RayActorError as e:
            raise self.lost(t, fired, e) from None
        return self.result(t, fired, results)
