"""The ``ray`` executor: the plan compiled into one Ray Compiled Graph.

One execution of the compiled graph is one step. Lowering (docs/architecture.md):

- each operation of the program becomes ``actor.exec.bind(inp, op_id, chain, *producers)``;
  ``chain`` (the previous operation on the same actor) pins each actor's order;
- a value between actors travels in a compiled-graph channel (shared memory on one
  host). Weights between whole GPUs go over omnigraph's own NCCL group
  (:mod:`omnigraph.transports.nccl`): their channel carries only the description, so Ray's
  NCCL channels (which assert on omnigraph's chained programs in Ray 2.60) are used only
  for a data edge that asks for ``transport: nccl``, and then compiling stops with a
  GraphError saying what to do; weights between pools sharing one GPU cross as a CUDA
  IPC handle (:mod:`omnigraph.transports.pack`);
- delayed edges are the interpreter's buffers: ``stash`` runs after the consumer's ``run``;
- each actor's ``collect`` is an output of the graph.

The driver keeps two executions in flight, so step ``t + 1`` is submitted while
step ``t`` runs, and sleeps on the actors' signals instead of spinning in ``get``.
Compiled Graphs' submit/get timeouts come from ``runtime.step_timeout_s``.

An actor that dies (killed, out of memory, its node lost) makes Ray's monitor tear the whole graph down:
every channel closes, and whatever the driver does next with it (submit the next step, read a step's
results) raises ``RayChannelError: Channel closed``, which names no actor. The driver's loop
(``RayExecutor.vanished``) turns it, like every other form of a vanished actor, into the NodeFailure that
names the dead actor's node, and the supervisor restarts from the newest checkpoint.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ray.dag import InputNode, MultiOutputNode

from ...errors import GraphError
from ..base import StepResult
from .adapter import compiled_dag_closed, quiet_compiled_dag
from .common import IN_FLIGHT, RayExecutor
from .failures import VANISHED


class RayCompiledExecutor(RayExecutor):
    name = "ray"
    uses_waits = True

    def start(self) -> None:
        super().start()
        self.compiled = None
        self.unread = 0             # executions submitted whose results were not read
        try:
            self.compiled = self._compile()
        except VANISHED as e:       # an actor died as the graph was set up on it
            raise self.lost(-1, frozenset(), e) from None

    def _compile(self):
        outs: dict[int, Any] = {}
        last: dict[str, Any] = {}
        transports = self._transports()
        with InputNode() as inp:
            for op in self.ops:
                actor = self.actors[op.actor]
                chain = last.get(op.actor, inp)
                node = actor.exec.bind(inp, op.id, chain, *(outs[p] for p in op.producers))
                if op.id in transports:
                    node = node.with_tensor_transport(transport=transports[op.id])
                outs[op.id] = last[op.actor] = node
            dag = MultiOutputNode([outs[op.id] for op in self.ops if op.kind == "collect"])
        try:
            return dag.experimental_compile(_submit_timeout=self.timeout, _max_inflight_executions=IN_FLIGHT + 1)
        except AssertionError as e:
            # Seen with Ray 2.60 on two H200s: its NCCL scheduling (dag_node_operation) asserts on
            # programs whose operations are chained on each actor, as omnigraph's are.
            if "nccl" in transports.values():
                raise GraphError("Ray Compiled Graphs cannot schedule this graph's nccl channels (data edges "
                                 "with transport: nccl)", where="edges",
                                 fix="remove transport: nccl from the data edges (batches are host tensors; "
                                     "weights go over NCCL anyway), or use --executor ray-tasks") from e
            raise

    def _transports(self) -> dict[int, str]:
        """Ops whose output crosses to another actor and gets a tensor transport hint: ``nccl`` only for
        data edges that ask for it; none where an actor has whole GPUs (Ray's ``auto`` would pick NCCL
        there; batches are host tensors and weights between whole GPUs travel over omnigraph's own group,
        so a plain channel carries them); ``auto`` otherwise."""
        by_task = {op.task: op.id for op in self.ops if op.kind == "run"}
        whole = {name for name, a in self.plan.actors.items() if a.gpus >= 1}
        out: dict[int, str | None] = {}
        for c in self.plan.channels:
            if c.transport == "local" or c.src not in by_task:
                continue
            op = by_task[c.src]
            if (c.transport == "nccl" and not c.edge.state) or out.get(op) == "nccl":
                out[op] = "nccl"
            elif c.src.actor in whole or c.dst.actor in whole or (op in out and out[op] is None):
                out[op] = None
            else:
                out[op] = "auto"
        return {op: t for op, t in out.items() if t is not None}

    def _submit(self, t: int, fired: frozenset):
        ref = self.compiled.execute((t, tuple(sorted(fired))))
        self.unread += 1
        return ref

    def _finish(self, t: int, fired: frozenset, ref) -> StepResult:
        """Step ``t``'s results (the caller, ``RayExecutor._collect``, turns Ray's errors of a dead actor and its
        timeouts into NodeFailures)."""
        if self.signals is not None:
            deadline = time.monotonic() + self.timeout
            missing = [f"done-{a}" for a in self.actors]
            while missing:
                missing = self.signals.wait_all(missing, min(1.0, max(0.0, deadline - time.monotonic())))
                if missing:
                    self.check_alive(t, fired)
                    if time.monotonic() >= deadline:
                        raise self.hung(t)
        self._driver_fault(t, "collect")
        results = [r.get(timeout=self.timeout) for r in ref]
        self.unread -= 1
        return self.result(t, fired, results)

    def seen_dead(self) -> bool:
        compiled = getattr(self, "compiled", None)
        return compiled is None or compiled_dag_closed(compiled)

    def stop(self) -> None:
        compiled, self.compiled = getattr(self, "compiled", None), None
        if getattr(self, "hang_seen", False) or getattr(self, "unread", 0):
            # a hung node, or a step still in flight when the run stopped (a failure, Ctrl-C), would hold
            # teardown() until its timeout: the actors go first (stop() kills them anyway)
            self.kill_actors()
        if compiled is not None:
            # teardown() waits for a hung node: give it a few seconds, then kill the actors anyway
            th = threading.Thread(target=_quiet_teardown, args=(compiled,), daemon=True)
            th.start()
            th.join(timeout=5)
        super().stop()


def _quiet_teardown(compiled) -> None:
    """Teardown whose complaints (e.g. about actors we already killed) never bury the real error."""
    with quiet_compiled_dag():
        try:
            compiled.teardown()
        except Exception:  # noqa: BLE001 - teardown errors never hide the original error
            pass
