"""The per-actor interpreter every executor hosts: nodes, delay buffers, weights arrival, the staleness check.

An executor (``local``, ``ray``, ``ray-tasks``) only moves values between
interpreters and calls their two entry points in plan order:

- ``run(node, step, inputs)``: ``inputs`` maps an edge index to the list of
  values the producer's ranks made this step (zero-delay edges only); the
  interpreter adds the values its delay buffers owe this step, gathers and
  shards streams for its rank, joins branches, calls the node by its role
  (:mod:`omnigraph.sdk.roles`) and returns its outputs;
- ``stash(edge, step, values)``: stores this step's value of a delayed edge
  (for weights: the ``apply`` task, where the transport delivers them).

Because the semantics live here, the same plan gives the same versions,
staleness and outputs on every executor. A node that fails is re-raised as a
:class:`NodeFailure` naming the node and the step.
"""

from __future__ import annotations

import collections
import io
import pickle
import random
import sys
import time
from typing import Any

from .. import transports
from ..errors import NodeFailure, StalenessError
from ..planning.plan import aligned
from ..proof.schedule import DelayLine
from ..sdk import ConfigError, Prompt, SampleBatch, Weights
from ..transports.base import portable
from . import build, checks
from .faults import Faults
from .regenerate import Regenerator
from .snapshot import groups_in, with_held


class Interpreter:
    def __init__(self, plan, actor: str):
        self.plan = plan
        self.actor = actor
        a = plan.actors[actor]
        self.rank = a.rank
        self.world = plan.graph.spec.pools[a.pool].actors
        self.policy_version = 0
        self.shared: dict[str, Any] = {}
        self.records: list[dict[str, Any]] = []
        self.faults = Faults(self.rank)
        g = plan.graph
        mine = [n for n in g.topo if any(t.node == n for t in plan.order[actor] if t.op == "run")]
        self.lines: dict[int, DelayLine] = {
            e.index: DelayLine(e.delay, e.state, initial=Weights(0) if e.state else None)
            for e in g.edges if e.dst in mine and (e.delay > 0 or e.state)}
        self._transports: dict[str, Any] = {}
        self._encoders: dict[str, Any] = {}       # exporter -> its delta base (payload delta)
        """Exporter -> its weights transport on this actor (made when first used: synthetic policies never do)."""
        self.versions: dict[str, int] = {}
        """Generator -> the weights version it holds."""
        self.in_flight: dict[str, set[int]] = {}
        """Generator with partial rollouts -> the prompt groups it carries unfinished to its next firing."""
        self._task = None
        self.nodes: dict[str, Any] = {}
        self.contexts = {}
        for name in mine:
            try:
                self.contexts[name] = build.context(plan, name, actor, self.shared, self.faults.hook(name))
                self.nodes[name] = build.node_class(g.nodes[name])(self.contexts[name])
            except NodeFailure:
                raise
            except Exception as e:  # noqa: BLE001 - reported with the node's name
                raise NodeFailure(name, -1, e) from e
            self.versions[name] = 0
        self.startup = {name: dict(ctx.metrics) for name, ctx in self.contexts.items() if ctx.metrics}
        self.regenerate = Regenerator(self) if g.spec.schedule.on_stale == "wait" and g.trainer.name in mine \
            else None

    @property
    def task(self):
        if self._task is None:
            self._task = build.task_of(self.plan.graph.spec)
        return self._task

    def prompts(self, step: int, world: int = 1, rank: int = 0) -> list[Prompt]:
        """The prompts of ``step`` with their group ids (``step * prompts + i``), rank ``rank``'s share."""
        return build.step_prompts(self.task, step, self.plan.graph.spec.task.prompts, world, rank)

    def _prompts_of(self, n, step: int) -> list[Prompt]:
        """A generator's prompts: its ``prompt_share`` of the step's (a lent generator's split), this rank's part."""
        share = getattr(n.spec, "prompt_share", None)
        if share is None:
            return self.prompts(step, self.world, self.rank)
        mine = self.prompts(step, 1, 0)[share[0]:share[1]]
        per = len(mine) // self.world
        return mine[self.rank * per:(self.rank + 1) * per]

    # -- the two entry points ------------------------------------------------
    def run(self, node: str, step: int, inputs: dict[int, list[Any]]) -> dict[str, Any]:
        g = self.plan.graph
        n = g.nodes[node]
        values = self._inputs(node, step, inputs)
        ctx = self.contexts[node]
        ctx.metrics = self.startup.pop(node, {})        # a node's first record also says how it started
        ctx.spans = []
        self._attach(node)
        record: dict[str, Any] = {"node": node, "actor": self.actor, "step": step}
        t0 = time.perf_counter()
        try:
            if n.role == "trainer":         # a regeneration (on_stale: wait) counts into the trainer's time
                values["batch"] = self._check_staleness(values["batch"], step, record)
            self.faults.at(node, step)
            out = self._call(n, step, values, record)
        except StalenessError:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the node and step
            if ctx.collectives is not None and self.world > 1:
                from ..transports.collectives import mark_failed
                mark_failed(self.actor, f"{node} at step {step}: {type(e).__name__}: {e}")
            raise NodeFailure(node, step, e) from e
        record["seconds"] = time.perf_counter() - t0
        record["t_start"], record["t_end"] = t0, t0 + record["seconds"]
        record.update(ctx.metrics)
        if ctx.spans:
            record["spans"] = list(ctx.spans)
        self.records.append(record)
        missing = set(n.outputs) - set(out or {})
        if missing:
            raise NodeFailure(node, step, f"returned no value for output(s) {', '.join(sorted(missing))}")
        return out

    def stash(self, edge: int, step: int, values: list[Any]) -> None:
        e = self.plan.graph.edges[edge]
        value = self._gather(e, values)
        self.lines[edge].push(step, self._arrive(e, value) if e.state else value)

    # -- calling a node by its role --------------------------------------------
    def _call(self, n, step: int, values: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        impl = self.nodes[n.name]
        out_port = next(iter(n.outputs), None)
        if n.role == "generator":
            weights = values["weights"]
            self.load(n.name, impl, weights)
            prompts = self._prompts_of(n, step)
            carried_in = self.in_flight.get(n.name, set())
            batch = impl.generate(step, prompts, weights)
            carried_out = set(impl.in_flight()) if n.spans > 1 else set()
            checks.rollout(n.name, batch, prompts, weights, carried_in=carried_in, carried_out=carried_out,
                           spans=n.spans)
            record.update(batch=step, weights_version=weights.version,
                          generated_groups=list(dict.fromkeys(p.group for p in prompts)))
            if n.spans > 1:                                 # partial rollouts: what came back, what stays
                self.in_flight[n.name] = carried_out
                record.update(emitted_groups=batch.groups, carried_groups=sorted(carried_out))
            rows = {p.group: [p.meta["row"], p.meta.get("epoch", 0)] for p in prompts if "row" in p.meta}
            if rows:                                        # prompts from data: the ledger keys groups by row
                record["generated_rows"] = rows
            if self._eval_due(n, step) and hasattr(impl, "evaluate"):
                held_out = self.task.eval_set()
                if held_out:                      # a task without held-out prompts is not evaluated
                    batch.meta["eval"] = impl.evaluate(held_out)
            return {out_port: batch}
        if n.role == "scorer":
            return {out_port: impl.score(step, values[next(iter(n.inputs))])}
        if n.role == "logprob":
            return {out_port: impl.logprobs(step, values[next(iter(n.inputs))])}
        if n.role == "trainer":
            impl.train(step, values["batch"])
            self.policy_version += 1
            record["version"] = self.policy_version
            return {out_port: Weights(version=self.policy_version)}
        if n.role == "exporter":
            out = self._export(n.name, impl, values["weights"])
            if out.path:
                record["weights_path"] = out.path          # what travelled: the plan's choice, checked by a test
            return {out_port: out}
        return impl(step, **values)

    def load(self, node: str, impl, weights: Weights) -> None:
        """A generator takes new weights when their version differs from the one it holds."""
        held = self.versions.get(node, 0)
        if weights.version != held:
            if weights.payload == "delta" and not weights.loaded:
                # after a restore ``held`` is -1 (reload whatever comes); the generator's restored tensors are of
                # its own restored version, and that is what an in-flight delta must start from
                base = held if held >= 0 else getattr(impl, "version", held)
                weights = self._apply_delta(node, impl, weights, base)
            impl.load_weights(weights)
            self.versions[node] = weights.version

    def _apply_delta(self, node: str, impl, weights: Weights, held: int) -> Weights:
        """A delta sync written into the generator's own tensors (``transports.delta``): checked against the
        version it holds, else a NodeFailure the supervisor restarts from (the new sender re-seeds densely)."""
        if not hasattr(impl, "weight_targets"):
            raise ConfigError(f"{node}: sync payload delta writes into the generator's own tensors, and this "
                              "backend offers none (weight_targets)", where=f"nodes.{node}.backend",
                              fix="use the hf backend, or sync payload: full")
        from ..transports.delta import apply      # torch: only a delta sync's receivers load it
        t0 = time.perf_counter()
        corrupt = self.faults.at(node, self.faults.step, "delta")      # a test damaging the rollout first
        apply(weights.tensors, impl.weight_targets("full"), held, corrupt=corrupt)
        return Weights(weights.version, payload="full", nbytes=weights.nbytes, path=weights.path, loaded=True,
                       arrive_s=time.perf_counter() - t0)

    def _export(self, node: str, impl, weights: Weights) -> Weights:
        t0 = time.perf_counter()
        state = impl.state()
        if state is None:                                  # a version-only policy (synthetic nodes)
            return Weights(version=weights.version, payload=getattr(impl, "payload", "full"))
        extra = {}
        if state.payload == "delta":                       # the values changed since the last export only
            from ..transports.delta import Encoder
            enc = self._encoders.setdefault(node, Encoder())
            state = enc.encode(state.tensors, state.dtype, weights.version)
            extra["sync_dense_bytes"] = enc.dense_bytes
        out = self.transport(node).export(state, weights.version, fault=self.contexts[node].fault)
        self.contexts[node].log(sync_bytes=out.nbytes, sync_export_s=time.perf_counter() - t0, **extra)
        return out

    def transport(self, exporter: str):
        """The weights transport the plan chose for ``exporter`` (sender or receiver side)."""
        if exporter not in self._transports:
            g = self.plan.graph
            # an export is unread for at most bound + 1 exports (the data edge's delay is within the bound)
            self._transports[exporter] = transports.make(self.plan.weights[exporter], exporter, g.nodes[exporter].spec,
                                                         in_flight=self.plan.bound + 1)
        return self._transports[exporter]

    def _eval_due(self, n, step: int) -> bool:
        every = getattr(n.spec, "eval_every", 0)
        last = self.plan.graph.spec.schedule.iterations - 1
        return self.rank == 0 and bool(every) and (step % every == 0 or step == last)

    def _collectives(self, n):
        """The pool's group: a data-parallel trainer's, or every node's of a sharded pool (a mesh of one too)."""
        mine = [grp.purpose for grp in self.plan.groups if self.actor in grp.members]
        sharded = "sharded" in mine
        if not sharded and (self.world == 1 or n.role != "trainer" or "data-parallel" not in mine):
            return None
        from ..transports.collectives import of   # torch.distributed: only data-parallel trainers load it
        return of(self.actor, self.world, sharded=sharded)

    def _attach(self, name: str):
        """The node's context with its collectives (the groups form after the nodes are built)."""
        ctx = self.contexts[name]
        ctx.collectives = ctx.collectives or self._collectives(self.plan.graph.nodes[name])
        return ctx

    # -- values in -------------------------------------------------------------
    def _inputs(self, node: str, step: int, inputs: dict[int, list[Any]]) -> dict[str, Any]:
        ports: dict[str, list[Any]] = {}
        for e in self.plan.graph.inputs_of(node):
            if e.index in inputs:
                value = self._gather(e, inputs[e.index])
                if e.state:
                    self.lines[e.index].push(step, self._arrive(e, value))
                    value = self.lines[e.index].read(step)
            else:
                value = self.lines[e.index].read(step)
            ports.setdefault(e.dst_port, []).append(value)
        return {p: v[0] if len(v) == 1 else join(node, p, v) for p, v in ports.items()}

    def _arrive(self, e, value: Any) -> Any:
        """Weights as they arrive: the transport delivers them, straight into the generator's own tensors when
        the next read of this line is this value (delay <= 1) and the generator offers them."""
        if e.src not in self.plan.weights or not isinstance(value, Weights) or value.tensors is None:
            return value
        node = self.nodes.get(e.dst)
        targets = None
        if e.delay <= 1 and hasattr(node, "weight_targets") and value.payload != "delta":
            targets = node.weight_targets(value.payload)
        return self.transport(e.src).arrive(value, targets)

    def _gather(self, e, values: list[Any]) -> Any:
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
        v = self.policy_version
        stale = [v - m for m in batch.min_version]
        record.update(batch=batch.batch_id, trained_groups=batch.groups, staleness_mean=sum(stale) / max(len(stale), 1),
                      staleness_max=max(stale, default=0), dropped=0, samples=len(batch))
        tokens = checks.token_staleness(batch, v)
        if tokens is not None:
            record.update(token_staleness_max=tokens[0], token_staleness_mean=tokens[1])
        over = [i for i, x in enumerate(stale) if x > limit]
        if not over:
            return batch
        if s.on_stale == "error":
            raise StalenessError(f"batch {batch.batch_id} trained at version {v} has staleness {max(stale)} > "
                                 f"bound {limit} ({len(over)} of {len(batch)} samples)")
        if s.on_stale == "drop":
            stale_idx = set(over)
            kept = batch.select([i for i in range(len(batch)) if i not in stale_idx])
            record["dropped"] = len(over)
            record["trained_groups"] = kept.groups
            record["dropped_groups"] = sorted(set(batch.group_ids) - set(kept.group_ids))
            return kept
        return self.regenerate(batch, step, v, limit, record)

    # -- checkpoints and the end ----------------------------------------------
    def finish(self, run_dir: str) -> None:
        """End of the run: nodes that keep something (the trainer's final weights) save it."""
        for name, node in self.nodes.items():
            if hasattr(node, "save"):
                self._attach(name)
                try:
                    node.save(run_dir)
                except Exception as e:  # noqa: BLE001 - reported with the node's name
                    raise NodeFailure(name, -1, e) from e

    def close(self) -> None:
        for t in self._transports.values():
            t.close()

    def snapshot_bytes(self) -> bytes:
        """Everything this actor needs to continue exactly: buffers, versions, node state, RNG; its trailer
        names the prompt groups it holds in flight (:mod:`.snapshot`), for the checkpoint's manifest."""
        for name in self.nodes:
            self._attach(name)
        state = {"actor": self.actor, "policy_version": self.policy_version, "versions": dict(self.versions),
                 "in_flight": {n: sorted(g) for n, g in self.in_flight.items()},
                 "lines": {i: (line.current, list(line.queue)) for i, line in self.lines.items()},
                 "nodes": {n: node.state_dict() for n, node in self.nodes.items() if hasattr(node, "state_dict")},
                 "python_rng": random.getstate()}
        torch = _torch()
        if torch is not None:
            state["torch_rng"] = torch.get_rng_state()
        buf = io.BytesIO()
        with portable():            # weights packs as host tensors, never as CUDA IPC handles or file names
            pickle.dump(state, buf, protocol=pickle.HIGHEST_PROTOCOL)
        return with_held(buf.getvalue(), self.held())

    def held(self) -> set[int]:
        """The prompt groups this actor holds, generated and not yet trained: in its delay buffers (the
        one-step-off edge) and unfinished in its partial rollouts."""
        held = set().union(*self.in_flight.values())
        for line in self.lines.values():
            if not line.state:
                held |= groups_in([v for _, v in line.queue])
        return held

    def restore_bytes(self, blob: bytes) -> None:
        state = pickle.loads(blob)
        if state["actor"] != self.actor:
            raise RuntimeError(f"checkpoint of actor {state['actor']} given to {self.actor}")
        self.policy_version = state["policy_version"]
        # a generator's engine need not keep its weights in its state (vLLM does not): each gets the weights of
        # its next firing again (the same tensors an uninterrupted run holds then)
        self.versions.update({n: -1 for n in state["versions"]})
        self.in_flight = {n: set(g) for n, g in state.get("in_flight", {}).items()}
        for i, (current, queue) in state["lines"].items():
            self.lines[i].current = current
            self.lines[i].queue = collections.deque(queue)
        for n, sd in state["nodes"].items():
            self._attach(n)
            self.nodes[n].load_state_dict(sd)
        random.setstate(state["python_rng"])
        if "torch_rng" in state:
            _torch().set_rng_state(state["torch_rng"])

    def pop_records(self) -> list[dict[str, Any]]:
        out, self.records = self.records, []
        return out

    def buffered(self) -> dict[int, int]:
        """Values waiting in each delay buffer (edge index -> count)."""
        return {i: len(line) for i, line in self.lines.items() if not line.state}


def _torch():
    """torch when a node of this process loaded it (synthetic graphs never import it)."""
    return sys.modules.get("torch")


def join(node: str, port: str, values: list[Any]) -> SampleBatch:
    if not all(isinstance(v, SampleBatch) for v in values):
        raise NodeFailure(node, -1, f"input {port} joins {len(values)} branches, but not all are sample batches")
    groups = [set(v.group_ids) for v in values]
    if sum(map(len, groups)) == len(set().union(*groups)):
        return SampleBatch.concat(values)       # shares of one step's prompt groups (a lent generator's)
    return SampleBatch.join(values)
