"""``schedule.on_stale: wait``: a stale batch is generated again, on the trainer, with its current weights.

When the trainer finds samples staler than ``schedule.max_staleness`` it
regenerates their prompt groups before training on them: the graph's stream
nodes upstream of the trainer run again on the trainer's actor, in
topological order, on the groups' prompts (the task gives the same prompts
for a step every time it is asked). The generators get the trainer's current
weights in-process (the exporter's ``state()``); nodes that live on the
trainer's actor run as they are (``old_logprob`` sees the weights it is about
to train), the others as *shadows*: instances of the same class built on this
actor the first time they are needed. A shadow generator is always separate
from the rollout's own, so the rollout's weights and version are untouched.

Every regenerated sample is checked again; the record carries the groups
(``regenerated_groups``, a ledger event each), the samples and the seconds.
"""

from __future__ import annotations

import time
from typing import Any

import networkx as nx

from ..errors import StalenessError
from ..sdk import SampleBatch, Weights
from . import build


class Regenerator:
    def __init__(self, interp):
        self.interp = interp
        g = interp.plan.graph
        stream = nx.DiGraph()
        stream.add_nodes_from(g.nodes)
        stream.add_edges_from((e.src, e.dst) for e in g.edges if not e.state)
        up = nx.ancestors(stream, g.trainer.name)
        self.chain = [n for n in g.topo if n in up]
        """The nodes that make the trainer's batch, in the order they run."""
        self.exporter = next(n.name for n in g.of_role("exporter"))
        self.shadows: dict[str, Any] = {}
        self.versions: dict[str, int] = {}

    def _impl(self, name: str) -> Any:
        g = self.interp.plan.graph
        if g.nodes[name].role != "generator" and name in self.interp.nodes:
            return self.interp.nodes[name]
        if name not in self.shadows:
            ctx = build.context(self.interp.plan, name, self.interp.actor, self.interp.shared)
            self.shadows[name] = build.node_class(g.nodes[name])(ctx)
            self.versions[name] = 0
        return self.shadows[name]

    def weights(self, version: int) -> Weights:
        """The trainer's current weights, in-process (no transport)."""
        state = self._impl(self.exporter).state()
        if state is None:
            return Weights(version)
        return Weights(version, tensors=state.tensors, payload=state.payload, path="in-process")

    def __call__(self, batch: SampleBatch, step: int, version: int, limit: int, record: dict) -> SampleBatch:
        t0 = time.perf_counter()
        g = self.interp.plan.graph
        groups = set(batch.group_ids)
        prompts = [p for p in self.interp.prompts(batch.batch_id) if p.group in groups]
        weights = self.weights(version)
        out: dict[str, dict[str, Any]] = {}
        for name in self.chain:
            n = g.nodes[name]
            impl = self._impl(name)
            if n.role == "generator":
                if self.versions[name] != version:
                    impl.load_weights(weights)
                    self.versions[name] = version
                out[name] = {next(iter(n.outputs)): impl.generate(batch.batch_id, prompts, weights)}
                continue
            ins: dict[str, list[Any]] = {}
            for e in g.stream_inputs(name):
                ins.setdefault(e.dst_port, []).append(out[e.src][e.src_port])
            values = {p: v[0] if len(v) == 1 else SampleBatch.join(v) for p, v in ins.items()}
            if n.role == "scorer":
                out[name] = {next(iter(n.outputs)): impl.score(batch.batch_id, values[next(iter(n.inputs))])}
            elif n.role == "logprob":
                out[name] = {next(iter(n.outputs)): impl.logprobs(batch.batch_id, values[next(iter(n.inputs))])}
            else:
                out[name] = impl(batch.batch_id, **values)
        parts = [out[e.src][e.src_port] for e in g.stream_inputs(g.trainer.name)]
        fresh = parts[0] if len(parts) == 1 else SampleBatch.join(parts)
        again = [version - m for m in fresh.min_version]
        if set(fresh.group_ids) != groups or max(again, default=0) > limit:
            raise StalenessError(f"batch {batch.batch_id} regenerated at version {version} still has staleness "
                                 f"{max(again, default=0)} > {limit} (groups {sorted(set(fresh.group_ids))[:6]})")
        record.update(regenerated=len(fresh), regenerated_groups=fresh.groups, regenerate_s=time.perf_counter() - t0,
                      staleness_mean=sum(again) / max(len(again), 1), staleness_max=max(again, default=0),
                      trained_groups=fresh.groups)
        return fresh
