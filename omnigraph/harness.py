"""The per-actor runtime that every executor hosts: nodes, delay buffers, the staleness check.

An executor (``local``, ``ray``, ``ray-tasks``) only moves values between
harnesses and calls their two entry points in plan order:

- ``run(node, step, inputs)``: ``inputs`` maps an edge index to the list of
  values the producer's ranks made this step (zero-delay edges only); the
  harness adds the values its delay buffers owe this step, concatenates and
  shards streams for its rank, runs the node and returns its outputs;
- ``stash(edge, step, values)``: stores this step's value of a delayed edge.

Because the semantics live here, the same plan gives the same versions,
staleness and outputs on every executor.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from .data import SampleBatch, Weights
from .errors import NodeFailure, StalenessError
from .node import ActorState, NodeContext
from .schedule import DelayLine


class ActorHarness:
    def __init__(self, plan, actor: str, seed: int | None = None):
        self.plan = plan
        self.actor = actor
        a = plan.actors[actor]
        self.rank = a.rank
        self.world = plan.graph.spec.pools[a.pool].actors
        self.seed = plan.graph.spec.runtime.seed if seed is None else seed
        self.state = ActorState()
        self.records: list[dict[str, Any]] = []
        # injected faults fire in the first attempt only, so a supervised restart gets past them
        first = os.environ.get("OMNIGRAPH_ATTEMPT", "0") == "0"
        self.faults = parse_faults(os.environ.get("OMNIGRAPH_INJECT", "")) if first else {}
        self.refresh: Callable[[SampleBatch, int], SampleBatch] | None = None
        """Set by executors that support ``on_stale: wait``: regenerate a batch with fresh weights."""
        g = plan.graph
        mine = {t.node for t in plan.order[actor] if t.op == "run"}
        self.lines: dict[int, DelayLine] = {
            e.index: DelayLine(e.delay, e.state, initial=Weights(0) if e.state else None)
            for e in g.edges if e.dst in mine and (e.delay > 0 or e.state)}
        self.nodes: dict[str, Any] = {}
        self.contexts: dict[str, NodeContext] = {}
        from nodes.registry import make_node
        for name in g.topo:
            if name in mine:
                ctx = NodeContext(actor, self.rank, self.world, self.seed, g.spec, self.state)
                self.contexts[name] = ctx
                try:
                    self.nodes[name] = make_node(g.nodes[name], ctx)
                except Exception as e:  # noqa: BLE001 - reported with the node's name
                    raise NodeFailure(name, -1, e) from e
        self.startup = {name: dict(ctx.metrics) for name, ctx in self.contexts.items() if ctx.metrics}

    # -- the two entry points ------------------------------------------------
    def run(self, node: str, step: int, inputs: dict[int, list[Any]]) -> dict[str, Any]:
        g = self.plan.graph
        kwargs: dict[str, Any] = {}
        for e in g.inputs_of(node):
            if e.index in inputs:
                value = self._gather(e, inputs[e.index])
                if e.state:
                    self.lines[e.index].push(step, self._arrive(e, value))
                    value = self.lines[e.index].read(step)
            else:
                value = self.lines[e.index].read(step)
            kwargs[e.dst_port] = value
        ctx = self.contexts[node]
        ctx.metrics = self.startup.pop(node, {})        # a node's first record also says how it started
        kind = g.nodes[node].kind
        record: dict[str, Any] = {"node": node, "actor": self.actor, "step": step}
        if kind == "update":
            kwargs["batch"] = self._check_staleness(kwargs["batch"], step, record)
        t0 = time.perf_counter()
        try:
            fault = self.faults.get((node, step)) or self.faults.get((f"{node}#{self.rank}", step))
            if fault:
                inject(fault, node, step)
            out = self.nodes[node](step, **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised with the node and step
            if kind == "update" and self.world > 1:
                from .dataparallel import mark_failed
                mark_failed(self.actor, f"{node} at step {step}: {type(e).__name__}: {e}")
            raise NodeFailure(node, step, e) from e
        record["seconds"] = time.perf_counter() - t0
        record["t_start"], record["t_end"] = t0, t0 + record["seconds"]
        if kind == "update":
            self.state.policy_version += 1
            out["weights"] = _stamp(out.get("weights"), self.state.policy_version)
            record["version"] = self.state.policy_version
        if kind == "generate":
            record["batch"] = step
            record["weights_version"] = kwargs["weights"].version
            rollout = next(iter(out.values()), None) if out else None
            if isinstance(rollout, SampleBatch):
                record["generated_groups"] = rollout.groups
        record.update(ctx.metrics)
        self.records.append(record)
        missing = set(g.nodes[node].outputs) - set(out or {})
        if missing:
            raise NodeFailure(node, step, f"returned no value for output(s) {', '.join(sorted(missing))}")
        return out

    def stash(self, edge: int, step: int, values: list[Any]) -> None:
        e = self.plan.graph.edges[edge]
        value = self._gather(e, values)
        self.lines[edge].push(step, self._arrive(e, value) if e.state else value)

    def finish(self, run_dir: str) -> None:
        """End of the run: nodes that keep something (the trainer's final weights) save it."""
        for name, node in self.nodes.items():
            if hasattr(node, "save"):
                try:
                    node.save(run_dir)
                except Exception as e:  # noqa: BLE001 - reported with the node's name
                    raise NodeFailure(name, -1, e) from e

    def snapshot_bytes(self) -> bytes:
        """Everything this actor needs to continue exactly: buffers, versions, node state, RNG."""
        import io
        import pickle
        import random
        state = {"actor": self.actor, "policy_version": self.state.policy_version,
                 "lines": {i: (line.current, list(line.queue)) for i, line in self.lines.items()},
                 "nodes": {n: node.state_dict() for n, node in self.nodes.items() if hasattr(node, "state_dict")},
                 "python_rng": random.getstate()}
        try:
            import torch
            state["torch_rng"] = torch.get_rng_state()
        except ImportError:
            pass
        from .tensors import portable
        buf = io.BytesIO()
        with portable():            # weights packs as host tensors, never as CUDA IPC handles
            pickle.dump(state, buf, protocol=pickle.HIGHEST_PROTOCOL)
        return buf.getvalue()

    def restore_bytes(self, blob: bytes) -> None:
        import collections
        import pickle
        import random
        state = pickle.loads(blob)
        if state["actor"] != self.actor:
            raise RuntimeError(f"checkpoint of actor {state['actor']} given to {self.actor}")
        self.state.policy_version = state["policy_version"]
        for i, (current, queue) in state["lines"].items():
            self.lines[i].current = current
            self.lines[i].queue = collections.deque(queue)
        for n, sd in state["nodes"].items():
            self.nodes[n].load_state_dict(sd)
        random.setstate(state["python_rng"])
        if "torch_rng" in state:
            import torch
            torch.set_rng_state(state["torch_rng"])

    def pop_records(self) -> list[dict[str, Any]]:
        out, self.records = self.records, []
        return out

    def buffered(self) -> dict[int, int]:
        """Values waiting in each delay buffer (edge index -> count)."""
        return {i: len(line) for i, line in self.lines.items() if not line.state}

    # -- internals -----------------------------------------------------------
    def _arrive(self, e, value: Any) -> Any:
        """Weights whose bytes come over NCCL (``omnigraph.weightsync``) are received now, as they arrive:
        every receiver takes each broadcast once, in the order the sender sent them. Straight into the
        consumer's model when the next read of this line is this value (delay <= 1) and the node can
        (``receive``); else into fresh tensors held in the line."""
        tensors = getattr(value, "tensors", None)
        if not getattr(tensors, "pending", False):
            return value
        node = self.nodes.get(e.dst)
        if e.delay <= 1 and hasattr(node, "receive"):
            return node.receive(value)
        from .weightsync import fetch
        return Weights(value.version, tensors=fetch(tensors), payload=value.payload, nbytes=value.nbytes)

    def _gather(self, e, values: list[Any]) -> Any:
        from .plan import aligned
        if e.state or aligned(self.plan.graph, e):
            return values[0]
        if all(isinstance(v, SampleBatch) for v in values):
            return SampleBatch.concat(values).shard(self.rank, self.world)
        return values[0] if len(values) == 1 else values

    def _check_staleness(self, batch: Any, step: int, record: dict[str, Any]) -> Any:
        """Measure every sample's staleness and apply ``schedule.on_stale`` to those over the limit."""
        if not isinstance(batch, SampleBatch):
            return batch
        s = self.plan.graph.spec.schedule
        limit = min(self.plan.bound, s.max_staleness)
        v = self.state.policy_version
        stale = [v - m for m in batch.min_version]
        record.update(batch=batch.batch_id, trained_groups=batch.groups, staleness_mean=sum(stale) / max(len(stale), 1),
                      staleness_max=max(stale, default=0), dropped=0, samples=len(batch))
        over = [i for i, x in enumerate(stale) if x > limit]
        if not over:
            return batch
        if s.on_stale == "error":
            raise StalenessError(f"batch {batch.batch_id} trained at version {v} has staleness {max(stale)} > "
                                 f"bound {limit} ({len(over)} of {len(batch)} samples)")
        if s.on_stale == "drop":
            stale = set(over)
            keep = [i for i in range(len(batch)) if i not in stale]
            record["dropped"] = len(over)
            kept = batch.select(keep)
            record["trained_groups"] = kept.groups
            record["dropped_groups"] = sorted(set(batch.group_ids) - set(kept.group_ids))
            return kept
        if self.refresh is None:
            raise StalenessError("on_stale: wait needs an executor that can regenerate batches (use executor local)")
        fresh = self.refresh(batch, v)
        again = [v - m for m in fresh.min_version]
        record.update(regenerated=len(batch), staleness_mean=sum(again) / max(len(again), 1),
                      staleness_max=max(again, default=0))
        return fresh


def _stamp(weights: Any, version: int) -> Weights:
    if isinstance(weights, Weights):
        weights.version = version
        return weights
    return Weights(version=version)


def parse_faults(text: str) -> dict[tuple[str, int], str]:
    """``OMNIGRAPH_INJECT="update@2:raise,generate@5:exit"`` -> {(node, step): action}; ``update#1@2``
    fires on rank 1 of the node's pool only.

    Fault injection for tests and ``bench/faults.py``: ``raise`` (the node raises),
    ``hang`` (it never returns), ``exit`` (its process dies at once, like ``kill -9``).
    """
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        where, _, action = item.partition(":")
        node, _, step = where.partition("@")
        out[(node, int(step))] = action or "raise"
    return out


def inject(action: str, node: str, step: int) -> None:
    if action == "hang":
        while True:
            time.sleep(3600)
    if action == "exit":
        os._exit(137)
    raise RuntimeError(f"injected fault in {node} at step {step}")
