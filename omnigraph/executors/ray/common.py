"""What both Ray executors share: starting Ray and the actors, the step loop, teardown (telling failures:
:mod:`.failures`)."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Iterator

import ray

from ... import plugins
from ...errors import GraphError, NodeFailure
from ...transports.shmfiles import remove_shm     # not .pack: the driver need not load torch
from ..base import Executor, StepResult
from ..faults import DriverFaults
from .placement import core_layout, fmt_labels, unlabelled
from .program import Op, pipe_names, program
from .actor import GraphActor
from .start import INIT, start_local, stop_node
from .signals import Signals, signal_dir
from .warm import WarmServer, preload_spec
from .failures import Failures

MIN_BUFFER = 1 << 20
IN_FLIGHT = 2
"""Executions in flight: step t + 1 is submitted while step t runs, so actors overlap."""
START_TIMEOUT_S = 600.0
def channel_bytes(plan) -> int:
    """Size of each compiled-graph channel buffer: a channel that must grow later makes teardown hang."""
    spec = plan.graph.spec
    samples = spec.task.prompts * spec.task.samples_per_prompt
    tokens = max((getattr(n.spec, "max_new_tokens", 0) for n in plan.graph.nodes.values()), default=0) + 64
    per_sample = tokens * 8 * 6 + 2048          # ids, masks, logprobs... as int64/float, plus texts
    est = samples * per_sample
    if any(c.edge.state and c.transport in ("host", "channel") for c in plan.channels):
        model = plugins.model_dir(spec.model.path, spec.model.seed)
        est = max(est, sum(f.stat().st_size for f in Path(model).glob("*.safetensors")))
    est = int(est * 1.25) + 65536
    if spec.runtime.channel_mb:
        est = int(spec.runtime.channel_mb * (1 << 20))
    return max(MIN_BUFFER, 1 << (est - 1).bit_length())


class RayExecutor(Failures, Executor):
    """Starts Ray (unless it runs already) and one GraphActor per plan actor."""

    uses_waits = False
    preload_torch = True
    """Each actor imports torch as it starts, before any thread of its own could: Compiled Graphs' loop
    imports it in a thread as it begins (two threads importing torch at once deadlock), and the first
    step would pay its seconds."""

    def start(self) -> None:

        self.driver_faults = DriverFaults()         # kills by the driver itself, for tests (OMNIGRAPH_INJECT)
        spec = self.plan.graph.spec
        self._owns_ray = not ray.is_initialized()
        # what Ray's workers preload, they load before an actor could set its environment (see _start_actors)
        self._fresh_workers = self._owns_ray and not spec.runtime.address and not os.environ.get("LD_PRELOAD")
        self._node = self.warm = None
        if self._owns_ray and spec.runtime.address:
            ray.init(address=spec.runtime.address, **INIT)
        elif self._owns_ray:                    # a local cluster of this process's own, on loopback
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            self.warm = self._warm_server()
            self._node = start_local(self.warm)
        self.timeout = float(spec.runtime.step_timeout_s)
        self.signals = None
        # pipes work between processes of one host: on a cluster (--address) Ray's own waiting is used
        waits = self.uses_waits and self.options.get("waits", True) and not spec.runtime.address
        self.ops: list[Op] = program(self.plan, waits=waits)
        if waits:
            self.signals = Signals(signal_dir())
            self.signals.create(pipe_names(self.ops))
        self._check_resources()
        self.actors = self._start_actors()
        if self.warm is not None:
            self._warm_wait()
        self.info = self._ready()
        self._join_groups()

    def _warm_server(self) -> WarmServer | None:
        """The warm server for this plan's actors (:mod:`.warm`), started before Ray; None where warm workers
        do not apply (switched off, not Linux, ``LD_PRELOAD``, a backend that refuses them)."""
        spec = self.plan.graph.spec
        if not (spec.runtime.warm_workers and self._fresh_workers and sys.platform == "linux"):
            return None
        uses_model = any(n.kind != "custom" and plugins.backend(n.kind, n.backend).uses_model
                         for n in self.plan.graph.nodes.values())
        model = plugins.model_dir(spec.model.path, spec.model.seed) if uses_model else None
        what = preload_spec(self.plan, model) if self.preload_torch else None
        return WarmServer(what, QUIET | python_path()) if what is not None else None

    def _warm_wait(self) -> None:
        """Until the warm server's imports are done (the actors wait for them anyway), saying so."""
        self.on_status("warm workers: importing torch and the nodes' code once")
        info = self.warm.ready()
        self.warm_info = info
        if info.get("failed"):
            self.on_status("warm workers: not preloaded: " + "; ".join(info["failed"]))

    def _join_groups(self) -> None:
        """The process groups the plan lists (``Plan.groups``), formed before the first step: weights over
        NCCL and data-parallel trainer actors. Rank 0 opens a store on a free port of its host, then every
        member joins at once."""
        for grp in self.plan.groups:
            name, members, backend = grp.name, list(grp.members), grp.backend
            what = {"weights": "weights", "sharded": "sharded training"}.get(grp.purpose, "data-parallel training")
            host, port = ray.get(self.actors[members[0]].open_store.remote(name), timeout=60)
            refs = [self.actors[a].join_group.remote(name, host, port, i, len(members),
                                                     max(3600.0, 4 * self.timeout), backend, grp.purpose == "sharded")
                    for i, a in enumerate(members)]
            try:
                errors = ray.get(refs, timeout=START_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise GraphError(f"the {backend} group for {what} ({', '.join(members)}) did not form within "
                                 f"{START_TIMEOUT_S:.0f} s", where="pools",
                                 fix="check that the GPUs can reach each other (NCCL_DEBUG=INFO says more), or "
                                     "set transport: shm on the weights edge") from None
            bad = [f"{a}: {err}" for a, err in zip(members, errors) if err]
            if bad:
                raise GraphError(f"the {backend} group for {what} could not form ({'; '.join(bad)})", where="pools",
                                 fix="set transport: shm on the weights edge to send them through Ray instead"
                                 if what == "weights" else "check that the trainer actors can reach each other")
            self.on_status(f"weights go over NCCL: {members[0]} -> {', '.join(members[1:])}" if what == "weights"
                           else f"{what} over {backend}: {', '.join(members)}")

    def _check_resources(self) -> None:
        """Fail at once, not after a long wait, when the pools cannot all be placed. On a cluster
        (``--address``) wait up to ``runtime.node_wait_s`` for the nodes to be there: after a node was
        lost, its replacement joining."""
        spec = self.plan.graph.spec
        want = {key: sum(getattr(a, res) for a in self.plan.actors.values()) for res, key in (("cpus", "CPU"),
                                                                                             ("gpus", "GPU"))}
        labels = {name: dict(p.labels) for name, p in spec.pools.items() if p.labels}
        # actors killed a moment ago free their resources soon
        wait = spec.runtime.node_wait_s if spec.runtime.address else 20.0
        deadline, said = time.monotonic() + wait, 0.0
        while True:
            free = ray.available_resources()
            unplaced = unlabelled(labels)
            if not unplaced and all(w <= free.get(k, 0.0) + 1e-9 for k, w in want.items()):
                return
            if time.monotonic() > deadline:
                break
            if spec.runtime.address and time.monotonic() - said > 5:
                said = time.monotonic()
                self.on_status("waiting for the cluster's nodes: " + (", ".join(
                    f"pool {n} needs a node labelled {fmt_labels(labels[n])}" for n in unplaced) or
                    f"{want['CPU']:g} CPUs and {want['GPU']:g} GPUs free"))
            time.sleep(0.5)
        for name in unplaced:
            raise GraphError(f"no live node of the cluster has the labels {fmt_labels(labels[name])}",
                             where=f"pools.{name}.labels",
                             fix="start a node with ray start --labels "
                                 + ",".join(f"{k}={v}" for k, v in labels[name].items())
                                 + " (or change the labels); runtime.node_wait_s sets how long a start waits")
        for res, key in (("cpus", "CPU"), ("gpus", "GPU")):
            if want[key] > free.get(key, 0.0) + 1e-9:
                raise GraphError(f"the pools ask for {want[key]:g} {res} but the Ray cluster has "
                                 f"{free.get(key, 0.0):g} free",
                                 where="pools", fix=f"lower pools.*.{res} or actors, or join a larger cluster (--address)")

    def actor_class_options(self) -> dict[str, Any]:
        """More ``ray.remote`` options for the actor class (an executor's own)."""
        return {}

    def _start_actors(self) -> dict[str, Any]:
        # one call at a time keeps the plan's order; status() runs beside it in its own group
        remote = ray.remote(concurrency_groups={"control": 1}, **self.actor_class_options())(GraphActor)
        env = {k: v for k, v in os.environ.items() if k.startswith(("OMNIGRAPH_", "NCCL_", "TORCH_NCCL_",
                                                                      "TORCH_SYMM_MEM_", "NVSHMEM_"))
               and k not in ("OMNIGRAPH_PIN_CPUS", "OMNIGRAPH_SHM_TAG", "OMNIGRAPH_ACTOR")}
        # the actors' /dev/shm weight files carry this tag: stop() removes them even after a kill
        self.shm_tag = env["OMNIGRAPH_SHM_TAG"] = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        env |= {"RAY_CGRAPH_buffer_size_bytes": str(channel_bytes(self.plan))} | QUIET | python_path()
        spec = self.plan.graph.spec
        cores = core_layout(self.plan, spec) if spec.runtime.pin_cpus else {}
        actors = {}
        for name, a in self.plan.actors.items():
            pin = {"OMNIGRAPH_PIN_CPUS": ",".join(map(str, cores[name]))} if name in cores else {}
            pin["OMP_NUM_THREADS"] = str(len(cores[name]) if name in cores else max(1, int(a.cpus)))
            pin["OMNIGRAPH_ACTOR"] = name            # which process is which (placement.jsonl has its pid)
            labels = dict(spec.pools[a.pool].labels)
            # The environment goes in as an argument, set by the actor before it imports anything that reads it
            # (torch: OMP_NUM_THREADS). On a cluster this executor just started, not also as a runtime_env: an
            # actor with a runtime_env of its own needs a new worker process, one without takes a worker Ray
            # prestarted beside ray.init (a second less). Otherwise a runtime_env sets it as the process starts:
            # on a cluster that ran before (idle workers that earlier tasks used: pinned elsewhere, torch loaded
            # with other threads), and under LD_PRELOAD (vLLM's CPU backend sets it to torch's libgomp in the
            # process it runs in: preloaded, OpenMP reads OMP_NUM_THREADS before the actor could set it).
            own = {} if self._fresh_workers else {"runtime_env": {"env_vars": env | pin}}
            actors[name] = remote.options(
                num_cpus=a.cpus, num_gpus=a.gpus, **({"label_selector": labels} if labels else {}), **own).remote(
                self.plan, name, self.ops, self.signals.dir if self.signals else None, self.timeout,
                self.preload_torch, env | pin)
        return actors

    def _ready(self) -> dict[str, dict[str, Any]]:
        refs = {name: a.ready.remote() for name, a in self.actors.items()}
        names = {r: n for n, r in refs.items()}
        waiting, t0 = list(refs.values()), time.monotonic()
        while waiting:                  # say who is still loading, every second, instead of looking hung
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=1.0)
            elapsed = time.monotonic() - t0
            if waiting and elapsed > START_TIMEOUT_S:
                raise GraphError(f"the actors did not start within {START_TIMEOUT_S:.0f} s "
                                 f"(still starting: {', '.join(names[r] for r in waiting)})",
                                 fix="check that the pools' cpus/gpus fit the cluster (ray status)")
            if waiting:
                self.on_status("starting " + ", ".join(f"{names[r]} ({self._loading(names[r])})" for r in waiting)
                               + f" {elapsed:.0f} s")
        try:
            info = dict(zip(refs, ray.get(list(refs.values()))))
        except ray.exceptions.RayActorError as e:        # its process or its node died while it started
            name = self._named(e) or "an actor"
            raise NodeFailure(name, -1, f"actor {name} died while starting ({type(e).__name__}): its process "
                                        "or its node is gone") from None
        for name, i in info.items():
            if i["error"]:
                raise NodeFailure.from_message(i["error"])
        return info

    def _loading(self, actor: str) -> str:
        """What an actor loads while it starts: its nodes' backends, and whether they load the model."""
        g = self.plan.graph
        nodes = [g.nodes[t.node] for t in self.plan.tasks if t.actor == actor and t.op == "run"]
        model = any(n.kind != "custom" and plugins.backend(n.kind, n.backend).uses_model for n in nodes)
        backends = ", ".join(dict.fromkeys(f"{n.backend} {n.kind}" for n in nodes))
        return f"model; {backends}" if model else backends

    def steps(self, start: int = 0, barrier=None, stop=None) -> Iterator[StepResult]:
        """Submit steps ahead and yield them in order; before a step where ``barrier(t)`` holds,
        everything in flight finishes first (a quiet point for checkpoints)."""
        firing = self.plan.firing()
        pending: deque = deque()
        for t in range(self.plan.steps):
            fired = firing.next()
            if t < start:
                continue
            if stop is not None and stop():
                break
            if barrier is not None and barrier(t):
                while pending:
                    yield self._collect(*pending.popleft())
            pending.append((t, fired, self._submit_step(t, fired)))
            if len(pending) >= IN_FLIGHT:
                yield self._collect(*pending.popleft())
        while pending:
            yield self._collect(*pending.popleft())

    def _submit_step(self, t: int, fired: frozenset):
        """Submit step ``t``; an actor that vanished before or meanwhile is a NodeFailure."""
        self._driver_fault(t, "submit")
        self._driver_fault(t, "submitting")
        with self.vanished(t, fired):
            ref = self._submit(t, fired)
        self._driver_fault(t, "submitted")
        return ref

    def _collect(self, t: int, fired: frozenset, ref) -> StepResult:
        """Step ``t``'s results; an actor that vanished before or meanwhile is a NodeFailure."""
        with self.vanished(t, fired):
            result = self._finish(t, fired, ref)
        self.last_step = t
        return result

    def snapshot(self) -> dict[str, bytes]:
        refs = {n: a.snapshot.options(concurrency_group="control").remote() for n, a in self.actors.items()}
        self._driver_fault(getattr(self, "last_step", -1), "snapshot")
        return dict(zip(refs, self._control(list(refs.values()))))

    def restore(self, snaps: dict[str, bytes]) -> None:
        self._control([a.restore.options(concurrency_group="control").remote(snaps[n])
                       for n, a in self.actors.items()])

    def _control(self, refs: list) -> list:
        """The results of control calls (snapshot, restore, finish) on every actor; an actor or its node lost meanwhile
        is a NodeFailure (the supervisor restarts from the last checkpoint), not Ray's error.

        It waits a second at a time and asks the cluster between waits whether an actor's node is gone: a call
        in flight when a node died did not always fail (Ray went on to recover its result), and a call to a live
        actor may wait on the one that was lost; either way the run would hang for ``START_TIMEOUT_S``."""
        waiting, deadline = list(refs), time.monotonic() + START_TIMEOUT_S
        while waiting:
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=1.0)
            if not waiting:
                break
            gone = self.dead_nodes()
            if gone:
                name, why = next(iter(gone.items()))
                self.hang_seen = True
                raise NodeFailure(name, -1, f"actor {name} is gone: {why}")
            if time.monotonic() > deadline:
                self.hang_seen = True
                raise NodeFailure("(control)", -1, f"the actors did not answer a snapshot, restore or finish within "
                                                   f"{START_TIMEOUT_S:.0f} s")
        try:
            return ray.get(refs, timeout=START_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as e:
            raise self.lost(-1, frozenset(), e) from None

    def placement(self) -> dict[str, dict[str, Any]]:
        """Where each actor runs: its node's id and labels, and its process."""
        return {name: {"node_id": i["node_id"], "labels": i.get("labels", {}), "pid": i["pid"], "warm": i["warm"]}
                for name, i in self.info.items()}

    def pids(self) -> dict[str, int]:
        return {name: i["pid"] for name, i in self.info.items()}

    def result(self, step: int, fired, results: list[dict[str, Any]]) -> StepResult:
        self.raise_failure(results)
        return StepResult(step=step, fired=fired, records=[r for x in results for r in x["records"]])

    def finish(self, run_dir: str) -> None:
        refs = [a.finish.options(concurrency_group="control").remote(run_dir) for a in self.actors.values()]
        for err in self._control(refs):
            if err:
                raise NodeFailure.from_message(err)

    def kill_actors(self) -> None:
        for a in getattr(self, "actors", {}).values():
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = {}

    def stop(self) -> None:
        self.kill_actors()
        if getattr(self, "shm_tag", None):
            remove_shm(self.shm_tag)
        if self.signals is not None:
            self.signals.remove()
            self.signals = None
        if getattr(self, "_owns_ray", False) and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False
        node, self._node = getattr(self, "_node", None), None
        stop_node(node)
        warm, self.warm = getattr(self, "warm", None), None
        if warm is not None:
            warm.stop()


QUIET = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
"""The actors' libraries keep their progress bars and advice to themselves (read as they load)."""


def python_path() -> dict[str, str]:
    """The driver's folder on the actors' path (a graph's dotted names may point into it)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)}
