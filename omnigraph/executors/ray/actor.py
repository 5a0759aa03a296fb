"""The actor every Ray executor starts: one per plan actor, hosting an :class:`Interpreter`.

``exec(inp, op_id, chain, *values)`` runs one operation of the program
(:mod:`omnigraph.executors.ray.program`) for the step in ``inp = (step, fired)``.
A node that raises does not raise through Ray: the operation returns a
:class:`Failed` value that every later operation passes on, so all signals
are still sent, the driver gets one clear failure, and the graph stays
usable until it is torn down.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import ray

from ...errors import NodeFailure
from ..interpreter import Interpreter
from .signals import Signals


@dataclass(frozen=True)
class Failed:
    node: str
    step: int
    message: str
    """:meth:`NodeFailure.wire`: the one-line message and the traceback (the driver writes it to errors.log)."""


class GraphActor:
    def __init__(self, plan, actor: str, ops, signal_dir: str | None, wait_timeout: float,
                 preload_torch: bool = True, env: dict[str, str] | None = None):
        # a warm worker (a fork of the warm server, executors.warm) starts with torch and the nodes' code loaded
        self.warm = os.environ.get("OMNIGRAPH_WARM_WORKER") == "1" and "torch" in sys.modules
        os.environ.update(env or {})        # first: torch, transformers and Ray's channels read it as they load
        sys.path.extend(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path)
        self.actor = actor
        self.ops = ops
        self.wait_timeout = wait_timeout
        self.current: tuple[str, int, float] | None = None
        self.signals = None
        self._status_fd = None
        if signal_dir:
            self.signals = Signals(signal_dir)
            # what this actor is running, readable by the driver even after the process dies
            self._status_fd = os.open(os.path.join(signal_dir, f"status-{actor}"), os.O_RDWR | os.O_CREAT, 0o600)
        self.init_error: str | None = None
        _pin_cores()
        if preload_torch:
            _set_threads(plan.actors[actor].cpus, load=True)
        self.waits: list[dict[str, Any]] = []
        try:
            self.interp = Interpreter(plan, actor)
        except NodeFailure as e:                 # reported by ready(), with the node's name (and its traceback)
            self.init_error = e.wire()
        except Exception as e:  # noqa: BLE001 - a GraphError (e.g. no CUDA) or a bug: still one clear message
            self.init_error = NodeFailure(actor, -1, e).wire()
        if not preload_torch:
            _set_threads(plan.actors[actor].cpus, load=False)

    # -- classic calls (before the graph starts, or concurrently with it) ----
    def ready(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        labels = {k: v for k, v in ctx.get_node_labels().items() if not k.startswith("ray.io/")}
        return {"pid": os.getpid(), "node_id": ctx.get_node_id(), "labels": labels, "error": self.init_error,
                "warm": self.warm,
                "gpu_ids": [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])], "cuda": _cuda_info()}

    def status(self) -> tuple[str, int, float] | None:
        """What this actor is doing now: (operation, step, seconds so far), or None when idle."""
        if self.current is None:
            return None
        label, step, t0 = self.current
        return label, step, time.perf_counter() - t0

    def finish(self, run_dir: str) -> str | None:
        try:
            self.interp.finish(run_dir)
        except NodeFailure as e:
            return e.wire()
        return None

    def snapshot(self) -> bytes:
        return self.interp.snapshot_bytes()

    def restore(self, blob: bytes) -> None:
        self.interp.restore_bytes(blob)

    def open_store(self, group: str) -> tuple[str, int]:
        """Rank 0 of a process group: a TCP store on a free port of this host (omnigraph.transports.groups)."""
        from ...transports.groups import open_store
        return open_store(group, ray.util.get_node_ip_address())

    def join_group(self, group: str, host: str, port: int, rank: int, world: int, timeout_s: float,
                   backend: str = "nccl", default: bool = False) -> str | None:
        """Join a weights, data-parallel or sharded group (every member at once); an error comes back as text."""
        from ...transports.groups import join
        try:
            join(group, host, port, rank, world, timeout_s, backend=backend, default=default)
        except Exception as e:  # noqa: BLE001 - reported by the driver with the actor's name
            return f"{type(e).__name__}: {e}"
        return None

    def cpu_times(self) -> tuple[float, float]:
        t = os.times()
        return t.user, t.system

    # -- the compiled (or called) program ------------------------------------
    def exec(self, inp, op_id: int, chain: Any, *values: Any) -> Any:
        step, fired = inp
        op = self.ops[op_id]
        failed = next((v for v in (chain, *values) if isinstance(v, Failed)), None)
        self.current = (op.label, step, time.perf_counter())
        if self._status_fd is not None and op.kind in ("run", "stash"):
            note = f"{op.task.node} {step}".encode().ljust(64)
            os.pwrite(self._status_fd, note, 0)
        try:
            if op.kind == "wait":
                return self._wait(op, step) or failed
            if op.kind == "collect":
                return self._collect(failed)
            if failed is not None:
                return failed
            return self._compute(op, step, fired, values)
        except NodeFailure as e:
            return Failed(e.node, e.iteration, e.wire())
        except Exception as e:  # noqa: BLE001 - a bug outside a node still must not hang the graph
            node = op.task.node if op.task else op.kind
            return Failed(node, step, NodeFailure(node, step, e).wire())
        finally:
            self.current = None
            if self.signals is not None:
                for name in op.signals:
                    self.signals.signal(name)

    def _compute(self, op, step: int, fired, values) -> Any:
        task = op.task
        graph = self.interp.plan.graph
        if op.kind == "run":
            if task.node not in fired:
                return None
            inputs, k = {}, 0
            for edge, port, n in op.inputs:
                if graph.edges[edge].src in fired:
                    inputs[edge] = [v[port] for v in values[k:k + n]]
                k += n
            return self.interp.run(task.node, step, inputs)
        edge, port, n = op.inputs[0]
        if graph.edges[edge].src in fired:
            t0 = time.perf_counter()
            self.interp.stash(edge, step, [v[port] for v in values])
            if graph.edges[edge].state:
                self.interp.records.append({"node": task.node, "actor": self.actor, "step": step, "kind": "apply",
                                             "apply_s": time.perf_counter() - t0})
        return None

    def _wait(self, op, step: int) -> None:
        t0 = time.perf_counter()
        if self.signals is not None:
            self.signals.wait_all(list(op.waits), self.wait_timeout)
        state = op.task.edge.state if op.task.op == "stash" else False
        self.waits.append({"node": op.task.node, "actor": self.actor, "step": step, "kind": "wait",
                           "wait_s": time.perf_counter() - t0, "wait_for": op.task.label, "weights": state})
        return None

    def _collect(self, failed: Failed | None) -> dict[str, Any]:
        records = self.interp.pop_records() + self.waits
        self.waits = []
        return {"actor": self.actor, "records": records, "failed": failed}


def _cuda_info() -> dict[str, Any] | None:
    """The card this actor computes on (None without CUDA): its uuid, name and memory in use."""
    torch = sys.modules.get("torch")          # only when the nodes imported it: never start CUDA here
    if torch is None or not torch.cuda.is_initialized():
        return None
    from ...transports.pack import device_uuid
    return {"uuid": device_uuid(), "name": torch.cuda.get_device_name(),
            "allocated_gb": round(torch.cuda.memory_allocated() / 1e9, 3),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _pin_cores() -> None:
    """With ``OMNIGRAPH_PIN_CPUS`` (see ``placement.core_layout``) the process runs on those cores only."""
    pinned = os.environ.get("OMNIGRAPH_PIN_CPUS")
    if pinned:
        os.sched_setaffinity(0, [int(c) for c in pinned.split(",")])


def _set_threads(cpus: float, load: bool) -> None:
    """Compute threads = the actor's CPUs (Ray pins OMP_NUM_THREADS; torch must agree). ``load``: import
    torch for it; else only a torch the nodes imported (a torch imported later reads the same count from
    OMP_NUM_THREADS)."""
    if load:
        try:
            import torch
        except ImportError:
            return
    else:
        torch = sys.modules.get("torch")
        if torch is None:
            return
    n = max(1, int(cpus))
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
