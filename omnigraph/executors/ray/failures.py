"""How a Ray executor's driver tells what failed: an actor that vanished (its process, its node), a step that
did not finish in time, a node that raised; each as the NodeFailure that names the node and the step, so that
the supervisor restarts. And the ``kill`` faults tests plant in the driver's loop (``OMNIGRAPH_INJECT``).

:class:`Failures` is a part of :class:`~omnigraph.executors.ray.common.RayExecutor` (its ``actors``, ``info``,
``plan``, ``signals``, ``timeout`` and ``driver_faults``), kept apart because it is its own concern.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, Iterator

import ray

from ...errors import NodeFailure
from .adapter import actor_id

LOST_WAIT_S = 15.0
"""How long the driver asks the actors which one is gone, after Ray said one is but not which (a closed channel)."""
VANISHED = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.RayChannelError,
            ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError, ray.exceptions.LocalRayletDiedError)
"""Ray's errors of an actor (or its node) that vanished, as the driver meets them: a call to it or a value of
it that cannot come (actor, object), and a compiled graph its monitor tore down on the actor's death (each
channel closed: submitting the next step, reading a step's results)."""



class Failures:
    """The failure half of the Ray executors' driver."""

    @contextlib.contextmanager
    def vanished(self, step: int, fired) -> Iterator[None]:
        """Within the block, Ray's errors of an actor that vanished (:data:`VANISHED`) become the NodeFailure that
        names it, and Ray's timeouts the hang's: the supervisor restarts on either, wherever the driver was
        (submitting a step, reading one). A compiled graph's monitor tears the graph down as soon as one of its
        actors dies, so the next submit or read finds its channel closed: ``RayChannelError``, which names nobody."""
        try:
            yield
        except NodeFailure:
            raise
        except (ray.exceptions.RayChannelTimeoutError, ray.exceptions.GetTimeoutError):
            self.check_alive(step, fired)           # a dead actor's step cannot finish: name it, not a hang
            raise self.hung(step) from None
        except VANISHED as e:
            raise self.lost(step, fired, e) from None

    def _driver_fault(self, step: int, point: str) -> None:
        """A ``kill`` planned for this point of the driver's loop (``OMNIGRAPH_INJECT``, tests only): SIGKILL the
        actor's process, then (except ``submitting``) wait until Ray has seen it die."""
        faults = getattr(self, "driver_faults", None)
        due = faults.due(step, point) if faults is not None else None
        if due is None:
            return
        node, rank = due
        tasks = self.plan.tasks_of(node)
        actor = tasks[min(rank, len(tasks) - 1)].actor if tasks else node
        os.kill(self.info[actor]["pid"], signal.SIGKILL)
        if point != "submitting":
            self._until_seen_dead(actor)

    def _until_seen_dead(self, actor: str, timeout: float = 60.0) -> None:
        """Until a call to ``actor`` fails as Ray's for a dead actor, then until :meth:`seen_dead`: the driver's next
        move meets the death as it would once Ray has noticed it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ray.get(self.actors[actor].status.options(concurrency_group="control").remote(), timeout=5)
            except ray.exceptions.RayActorError:
                break
            except ray.exceptions.GetTimeoutError:
                pass
            time.sleep(0.05)
        while not self.seen_dead() and time.monotonic() < deadline:
            time.sleep(0.05)

    def seen_dead(self) -> bool:
        """Whether this executor's own machinery has noticed an actor's death (a compiled graph: torn down)."""
        return True

    def dead_nodes(self) -> dict[str, str]:
        """Our actors whose node the cluster has marked dead: actor name -> what happened."""
        where = {name: i.get("node_id") for name, i in getattr(self, "info", {}).items()}
        if not where:
            return {}
        try:
            alive = {n["NodeID"]: n.get("Alive", False) for n in ray.nodes()}
        except Exception:  # noqa: BLE001 - the cluster's control store is unreachable: the caller's own wait decides
            return {}
        return {name: f"its node {node[:8]} died" for name, node in where.items()
                if node and not alive.get(node, False)}

    def raise_failure(self, results: list[dict[str, Any]]) -> None:
        for r in results:
            f = r.get("failed")
            if f is not None:
                raise NodeFailure.from_message(f.message)

    def lost(self, step: int, fired, err) -> NodeFailure:
        """A step's RayActorError as a NodeFailure naming the node whose actor is gone (its process, or the
        host it ran on: a lost node), so that the supervisor restarts."""
        self.hang_seen = True
        name = self._named(err)
        if name is not None:
            node, at = self._last_op(name, step, fired)
            where = self.info.get(name, {}).get("node_id", "")[:8]
            return NodeFailure(node, at, f"actor {name} is gone ({type(err).__name__}): its process or its "
                                         f"node {where} died")
        # the error names nobody (a compiled graph's closed channel): ask the actors, a while, for Ray to know
        deadline = time.monotonic() + LOST_WAIT_S
        while True:
            try:
                self.check_alive(step, fired)
            except NodeFailure as f:
                return f
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return NodeFailure("(unknown)", step, f"an actor is gone: {type(err).__name__}: {err}")

    def _named(self, err) -> str | None:
        """Which of our actors a RayActorError is about (None when it does not say)."""
        gone = getattr(err, "actor_id", None)
        return next((n for n, a in self.actors.items() if gone and actor_id(a) == gone), None)

    def check_alive(self, step: int, fired) -> None:
        """Raise a NodeFailure naming the node whose actor process died (e.g. killed, out of memory)."""
        for name, a in self.actors.items():
            try:
                ray.get(a.status.options(concurrency_group="control").remote(), timeout=5)
            except ray.exceptions.GetTimeoutError:
                why = self.dead_nodes().get(name)     # no answer, and the cluster has given up on its node
                if why is not None:
                    node, step = self._last_op(name, step, fired)
                    self.hang_seen = True
                    raise NodeFailure(node, step, f"actor {name} is gone: {why}") from None
                continue                        # alive, busy
            except ray.exceptions.RayError:
                node, step = self._last_op(name, step, fired)
                self.hang_seen = True
                raise NodeFailure(node, step, f"actor {name} died (its process exited)") from None

    def _last_op(self, actor: str, step: int, fired) -> tuple[str, int]:
        """The node a dead actor was running (it notes each op in the signal folder), else a guess."""
        if self.signals is not None:
            try:
                node, at = open(os.path.join(self.signals.dir, f"status-{actor}")).read().split()
                return node, int(at)
            except (OSError, ValueError):
                pass
        nodes = [t.node for t in self.plan.order[actor] if t.op == "run" and t.node in fired]
        return (nodes[0] if nodes else actor), step

    def hung(self, step: int) -> NodeFailure:
        """The failure to report when a step did not finish in time: the node still running."""
        stuck = []
        for name, a in self.actors.items():
            try:
                s = ray.get(a.status.options(concurrency_group="control").remote(), timeout=5)
            except Exception:  # noqa: BLE001 - a dead actor says nothing
                s = ("(actor not responding)", step, self.timeout)
            if s and not s[0].startswith("wait"):
                stuck.append(s)
        self.hang_seen = True       # stop() kills the actors before tearing the graph down
        label, at, _ = max(stuck, key=lambda s: s[2]) if stuck else ("(unknown)", step, 0)
        node = label.split(" ")[-1]
        return NodeFailure(node, at, f"did not finish within runtime.step_timeout_s = {self.timeout:g} s")
