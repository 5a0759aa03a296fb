"""The ``local`` executor: the plan in one process, deterministically.

It is the reference semantics: tasks run one at a time in the plan's global
order, values move as Python objects, and every actor is an
:class:`~omnigraph.harness.ActorHarness` in this process. Use it for tests
and to step through a graph with a debugger.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..data import SampleBatch, Weights
from ..harness import ActorHarness
from .base import Executor, StepResult


class LocalExecutor(Executor):
    name = "local"

    def start(self) -> None:
        self.harness = {a: ActorHarness(self.plan, a) for a in self.plan.actors}
        if self.plan.graph.spec.schedule.on_stale == "wait":
            for h in self.harness.values():
                h.refresh = self._refresh

    def snapshot(self) -> dict[str, bytes]:
        return {a: h.snapshot_bytes() for a, h in self.harness.items()}

    def restore(self, snaps: dict[str, bytes]) -> None:
        for a, h in self.harness.items():
            h.restore_bytes(snaps[a])

    def steps(self, start: int = 0, barrier=None) -> Iterator[StepResult]:
        plan = self.plan
        firing = plan.firing()
        for t in range(plan.steps):
            fired = firing.next()
            if t < start:
                continue
            out: dict[Any, dict[str, Any]] = {}
            for task in plan.tasks:
                h = self.harness[task.actor]
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
                             records=[r for h in self.harness.values() for r in h.pop_records()])

    def _refresh(self, batch: SampleBatch, version: int) -> SampleBatch:
        """``on_stale: wait``: regenerate the batch's prompts with the trainer's current weights.

        Runs the rollout side (generate and the nodes between it and the
        trainer) again for the batch's step, with weights of ``version``.
        """
        from ..delays import boundary_edges
        g = self.plan.graph
        boundary = boundary_edges(g.nodes, g.edges)
        stop = {e.src for e in boundary}
        values: dict[str, dict[str, Any]] = {}
        for name in g.topo:
            node = g.nodes[name]
            if node.kind == "generate":
                h = self._harness_of(name)
                values[name] = h.nodes[name](batch.batch_id, weights=Weights(version))
            elif values and all(e.src in values for e in g.stream_inputs(name)) and g.stream_inputs(name):
                h = self._harness_of(name)
                kw = {e.dst_port: values[e.src][e.src_port] for e in g.stream_inputs(name)}
                values[name] = h.nodes[name](batch.batch_id, **kw)
            if name in stop:
                port = next(e.src_port for e in boundary if e.src == name)
                return values[name][port]
        raise RuntimeError("no rollout-to-trainer boundary to regenerate up to")

    def _harness_of(self, node: str) -> ActorHarness:
        return self.harness[self.plan.tasks_of(node)[0].actor]

    def finish(self, run_dir: str) -> None:
        for h in self.harness.values():
            h.finish(run_dir)

    def stop(self) -> None:
        self.harness = {}
