"""The ``local`` executor: the plan in one process, deterministically.

It is the reference semantics: tasks run one at a time in the plan's global
order, values move as Python objects, and every actor is an
:class:`~omnigraph.executors.interpreter.Interpreter` in this process. Use it for tests
and to step through a graph with a debugger.
"""

from __future__ import annotations

from typing import Any, Iterator

from .base import Executor, StepResult
from .interpreter import Interpreter


class LocalExecutor(Executor):
    name = "local"

    def start(self) -> None:
        self.interpreters = {a: Interpreter(self.plan, a) for a in self.plan.actors}

    def snapshot(self) -> dict[str, bytes]:
        return {a: h.snapshot_bytes() for a, h in self.interpreters.items()}

    def restore(self, snaps: dict[str, bytes]) -> None:
        for a, h in self.interpreters.items():
            h.restore_bytes(snaps[a])

    def steps(self, start: int = 0, barrier=None, stop=None) -> Iterator[StepResult]:
        plan = self.plan
        firing = plan.firing()
        for t in range(plan.steps):
            fired = firing.next()
            if t < start:
                continue
            if stop is not None and stop():
                return
            out: dict[Any, dict[str, Any]] = {}
            for task in plan.tasks:
                h = self.interpreters[task.actor]
                if task.op == "run":
                    if task.node not in fired:
                        continue
                    inputs = {e.index: [out[p][e.src_port] for p in plan.producers(e, task.rank)]
                              for e in plan.graph.inputs_of(task.node) if e.delay == 0 and e.src in fired}
                    out[task] = h.run(task.node, t, inputs)
                elif task.edge.src in fired:
                    h.stash(task.edge.index, t,
                            [out[p][task.edge.src_port] for p in plan.producers(task.edge, task.rank)])
            yield StepResult(step=t, fired=fired,
                             records=[r for h in self.interpreters.values() for r in h.pop_records()])

    def finish(self, run_dir: str) -> None:
        for h in self.interpreters.values():
            h.finish(run_dir)

    def stop(self) -> None:
        for h in getattr(self, "interpreters", {}).values():
            h.close()
        self.interpreters = {}
