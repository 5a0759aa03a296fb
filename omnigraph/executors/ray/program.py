"""The plan as a flat list of operations, the form the Ray executors bind or call.

Per step, in the plan's global order:

- ``run`` / ``stash``: a plan task; its arguments are the values of its
  producers, in the order ``inputs`` lists them;
- ``wait`` (Compiled Graphs only, same host): sleeps until every producer on
  another actor has signalled, just before the task that reads their values;
- ``collect``: each actor's last operation of the step: returns the step's
  records to the driver and signals it.

Every operation on an actor also takes the previous operation's output on
that actor as its first value (the *chain*), which forces Ray to run them in
plan order (Ray otherwise orders each actor's tasks itself: a weight-sync task bound in the same execution as
generate, measured on Ray 2.60, made a one-step-off step serial).
Pure Python: no Ray import.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...planning.plan import Plan, Task


@dataclass(frozen=True)
class Op:
    id: int
    kind: str                                   # run | stash | wait | collect
    actor: str
    task: Task | None = None
    inputs: tuple[tuple[int, str, int], ...] = ()
    """(edge index, producer port, number of producer values) in argument order."""
    producers: tuple[int, ...] = ()
    """Op ids whose outputs are the arguments, in order."""
    waits: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.task.label if self.task else self.kind


def program(plan: Plan, waits: bool) -> list[Op]:
    ops: list[Op] = []
    op_of: dict[Task, int] = {}
    signals: dict[int, list[str]] = {}
    for task in plan.tasks:
        if task.op == "run":
            edges = [e for e in plan.graph.inputs_of(task.node) if e.delay == 0]
        else:
            edges = [task.edge]
        inputs, producers = [], []
        for e in edges:
            ps = plan.producers(e, task.rank)
            inputs.append((e.index, e.src_port, len(ps)))
            producers += [op_of[p] for p in ps]
        remote = sorted({p for p in producers if ops[p].actor != task.actor})
        this_id = len(ops) + (1 if waits and remote else 0)
        if waits and remote:
            names = tuple(f"p{p}-c{this_id}" for p in remote)
            for p, name in zip(remote, names):
                signals.setdefault(p, []).append(name)
            ops.append(Op(len(ops), "wait", task.actor, task, waits=names))
        ops.append(Op(this_id, task.op, task.actor, task, tuple(inputs), tuple(producers)))
        op_of[task] = this_id
    for actor in plan.actors:
        ops.append(Op(len(ops), "collect", actor, signals=(f"done-{actor}",) if waits else ()))
    return [Op(o.id, o.kind, o.actor, o.task, o.inputs, o.producers, o.waits, tuple(signals.get(o.id, ())))
            if o.kind in ("run", "stash") else o for o in ops]


def pipe_names(ops: list[Op]) -> list[str]:
    return sorted({n for o in ops for n in o.waits + o.signals})
