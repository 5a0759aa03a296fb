"""Validation: turn a :class:`GraphSpec` into a resolved :class:`~omnigraph.graph.ir.Graph`, or say why not.

One pass, one check per function, every problem a :class:`GraphError` naming
the node, edge or field and the fix. The invariants (docs/architecture.md):

1. zero-delay edges form a DAG;
2. the weight cycle ``trainer -> exporter -> generator -> ... -> trainer`` exists and is unique;
3. port types match along every edge and every input is connected; the
   branches of a join carry batches of the same step;
4. (staleness: :mod:`omnigraph.proof.staleness`);
5. placement is feasible;
6. the batch arithmetic is consistent.

Everything is decided by node *roles* (:data:`omnigraph.graph.ports.ROLE`) and the
plugin registry (:mod:`omnigraph.plugins`), never by backend names.
"""

from __future__ import annotations

import math

import networkx as nx

from .. import plugins, transports
from .delays import assign_delays
from ..errors import GraphError
from .warnings import overlap_warnings
from ..graph.ir import Edge, Graph, Node
from ..graph.ports import ROLE, compatible, is_state, signature
from .schedule import arrival
from ..sdk import TRAINER_ROLES
from ..graph.spec import GraphSpec
from .problems import Problems
from .references import check_data, check_references


def resolve(spec: GraphSpec, cluster: dict[str, float] | None = None) -> Graph:
    """Validate ``spec`` and return the resolved graph; raise :class:`GraphError` otherwise.

    ``cluster`` (``{"cpus": n, "gpus": m}``) are the resources available; when given,
    the pools must fit in them.
    """
    errors = Problems()
    nodes = _nodes(spec, errors)
    edges = _edges(spec, nodes, errors)
    errors.raise_if_any()
    _inputs_connected(nodes, edges, errors)
    _structure(nodes, edges, errors)
    errors.raise_if_any()
    edges = assign_delays(spec, nodes, edges)
    topo = _zero_delay_order(nodes, edges)
    _joins_aligned(nodes, edges, errors)
    _rates(nodes, edges, errors)
    _batch_arithmetic(spec, nodes, errors)
    _placement(spec, cluster, errors)
    _weights_paths(spec, nodes, edges, errors)
    check_references(spec, nodes, errors)
    errors.raise_if_any()
    data = check_data(spec, errors)
    errors.raise_if_any()
    graph = Graph(name=spec.name, spec=spec, nodes=nodes, edges=edges, topo=topo, data=data)
    graph.warnings.extend(overlap_warnings(graph))
    evaluating = [n for n, o in spec.nodes.items() if getattr(o, "eval_every", 0)]
    if data is not None and data.get("eval_rows") == 0 and evaluating:
        graph.warnings.append(f"'{evaluating[0]}' evaluates every {spec.nodes[evaluating[0]].eval_every} steps, but the "
                              "task holds no prompts out (task.eval_split): there will be no evaluation")
    return graph


# ---------------------------------------------------------------- nodes and edges


def _nodes(spec: GraphSpec, errors: Problems) -> dict[str, Node]:
    nodes: dict[str, Node] = {}
    for name, ns in spec.nodes.items():
        if ns.pool not in spec.pools:
            known = ", ".join(spec.pools) or "none"
            errors.add(f"pool '{ns.pool}' is not defined (pools: {known})", where=f"nodes.{name}.pool",
                       fix=f"add pools.{ns.pool}: {{actors: 1, cpus: 1}} or use one of the defined pools")
        sig = signature(ns.kind, getattr(ns, "inputs", None), getattr(ns, "outputs", None))
        every = 1
        if ns.kind == "sync":
            every = ns.every or spec.schedule.sync_every
        elif ns.kind == "custom":
            every = ns.every
        nodes[name] = Node(name=name, kind=ns.kind, role=ROLE[ns.kind], backend=getattr(ns, "backend", "custom"),
                           pool=ns.pool, inputs=dict(sig.inputs), outputs=dict(sig.outputs), every=every,
                           spans=ns.partial.max_spans if getattr(ns, "partial", None) else 1, spec=ns)
    if not nodes:
        errors.add("the graph has no nodes", where="nodes",
                   fix="define generate, reward, old_logprob, update and sync (see graphs/grpo_one_step_off.yaml)")
    return nodes


def _edges(spec: GraphSpec, nodes: dict[str, Node], errors: Problems) -> list[Edge]:
    edges: list[Edge] = []
    taken: dict[tuple[str, str], str] = {}
    for i, es in enumerate(spec.edges):
        where = f"edges[{i}] ({es.arrow})"
        missing = [n for n in (es.src, es.dst) if n not in nodes]
        for n in missing:
            errors.add(f"unknown node '{n}' (nodes: {', '.join(nodes) or 'none'})", where=where,
                       fix=f"define nodes.{n} or correct the name")
        if missing:
            continue
        src, dst = nodes[es.src], nodes[es.dst]
        sp = _src_port(src, es.src_port, where, errors)
        if sp is None:
            continue
        dp = _dst_port(dst, dst_port=es.dst_port, src_type=src.outputs[sp], where=where, errors=errors)
        if dp is None:
            continue
        if not compatible(src.outputs[sp], dst.inputs[dp]):
            errors.add(f"type mismatch: {es.src}.{sp} is {src.outputs[sp]} but {es.dst}.{dp} takes "
                       f"{dst.inputs[dp]}", where=where,
                       fix="connect a port of the matching type (e.g. generate -> reward -> old_logprob)")
            continue
        if (es.dst, dp) in taken and is_state(dst.inputs[dp]):
            errors.add(f"input {es.dst}.{dp} already has a producer ({taken[(es.dst, dp)]}): a {dst.inputs[dp]} "
                       "input holds one value", where=where, fix="each state input takes exactly one edge; remove one")
            continue
        if any(e.src == es.src and e.src_port == sp and e.dst == es.dst and e.dst_port == dp for e in edges):
            errors.add(f"the edge {es.arrow} is given twice", where=where, fix="remove one of them")
            continue
        taken[(es.dst, dp)] = es.arrow
        edges.append(Edge(src=es.src, src_port=sp, dst=es.dst, dst_port=dp, type=src.outputs[sp],
                          delay=-1 if es.delay is None else es.delay, transport=es.transport, index=i))
    return edges


def _src_port(node: Node, port: str | None, where: str, errors: Problems) -> str | None:
    if port is not None:
        if port not in node.outputs:
            errors.add(f"node '{node.name}' has no output '{port}' (outputs: {', '.join(node.outputs) or 'none'})",
                       where=where, fix="name one of its outputs")
            return None
        return port
    if len(node.outputs) != 1:
        errors.add(f"node '{node.name}' has outputs {', '.join(node.outputs) or 'none'}; the edge must name one",
                   where=where, fix=f"write '{node.name}.<output> -> ...'")
        return None
    return next(iter(node.outputs))


def _dst_port(node: Node, dst_port: str | None, src_type: str, where: str, errors: Problems) -> str | None:
    if dst_port is not None:
        if dst_port not in node.inputs:
            errors.add(f"node '{node.name}' has no input '{dst_port}' (inputs: {', '.join(node.inputs) or 'none'})",
                       where=where, fix="name one of its inputs")
            return None
        return dst_port
    fits = [p for p, t in node.inputs.items() if t == src_type] or \
        [p for p, t in node.inputs.items() if compatible(src_type, t)]
    if len(fits) == 1:
        return fits[0]
    if not fits:
        have = ", ".join(f"{p}: {t}" for p, t in node.inputs.items()) or "none"
        errors.add(f"node '{node.name}' has no input of type {src_type} (inputs: {have})", where=where,
                   fix="connect it to a node that takes this type")
    else:
        errors.add(f"node '{node.name}' has several inputs of type {src_type} ({', '.join(fits)})",
                   where=where, fix=f"write '... -> {node.name}.<input>'")
    return None


def _inputs_connected(nodes: dict[str, Node], edges: list[Edge], errors: Problems) -> None:
    connected = {(e.dst, e.dst_port) for e in edges}
    for n in nodes.values():
        for port, typ in n.inputs.items():
            if (n.name, port) not in connected:
                makers = [m.name for m in nodes.values() if m.name != n.name and typ in m.outputs.values()]
                fix = (f"add an edge into it from a node with a {typ} output ({', '.join(makers)})" if makers
                       else f"add a node with a {typ} output and an edge from it to {n.name}.{port}")
                errors.add(f"input '{port}' ({typ}) is not connected", where=f"nodes.{n.name}", fix=fix)


# ---------------------------------------------------------------- structure


def _structure(nodes: dict[str, Node], edges: list[Edge], errors: Problems) -> None:
    trainers = [n for n in nodes.values() if n.role == "trainer"]
    gens = [n for n in nodes.values() if n.role == "generator"]
    if len(trainers) != 1:
        errors.add(f"the graph needs exactly one update node, found {len(trainers)}"
                   + (f" ({', '.join(n.name for n in trainers)})" if trainers else ""),
                   where="nodes", fix="keep one node of kind update (the policy trainer)")
    if not gens:
        errors.add("the graph has no generate node", where="nodes",
                   fix="add nodes.generate: {kind: generate, pool: rollout}")
    if len(trainers) != 1 or not gens:
        return
    update = trainers[0]
    for n in nodes.values():
        if n.kind == "old_logprob" and n.pool != update.pool:
            errors.add(f"old_logprob runs on pool '{n.pool}' but it reads the trainer's weights on pool "
                       f"'{update.pool}'", where=f"nodes.{n.name}.pool", fix=f"set pool: {update.pool}")
    _scored(update, nodes, edges, errors)
    g = nx.MultiDiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((e.src, e.dst) for e in edges)
    weights = nx.DiGraph()
    weights.add_edges_from((e.src, e.dst) for e in edges if e.state)
    for gen in gens:
        if not nx.has_path(g, gen.name, update.name):
            errors.add(f"no path from '{gen.name}' to '{update.name}': its samples are never trained",
                       where=f"nodes.{gen.name}", fix="connect generate -> reward -> old_logprob -> update")
        if gen.name not in weights or update.name not in weights or not nx.has_path(weights, update.name, gen.name):
            errors.add(f"the weight cycle is open: no weights path {update.name} -> sync -> {gen.name}",
                       where=f"nodes.{gen.name}", fix="add 'update -> sync' and 'sync -> generate'")
            continue
        paths = list(nx.all_simple_paths(weights, update.name, gen.name))
        if len(paths) > 1:
            shown = "; ".join(" -> ".join(p) for p in paths[:3])
            errors.add(f"the weight cycle is not unique: weights reach '{gen.name}' by {len(paths)} paths ({shown})",
                       where=f"nodes.{gen.name}", fix="keep a single sync path from update to each generate")
        elif not any(nodes[x].role == "exporter" for x in paths[0][1:-1]):
            errors.add(f"weights go from '{update.name}' to '{gen.name}' without a sync node",
                       where=f"nodes.{gen.name}", fix="route them through a node of kind sync: update -> sync -> generate")


def _scored(update: Node, nodes: dict[str, Node], edges: list[Edge], errors: Problems) -> None:
    """A rollout may enter a logprob node unscored (a branch beside the reward), but what the update trains
    must have passed a scorer (or a custom node) on some branch: its advantages come from there."""
    stream = nx.DiGraph((e.src, e.dst) for e in edges if not e.state)
    before = nx.ancestors(stream, update.name) if update.name in stream else set()
    if not before or any(nodes[n].role in ("scorer", "transform") for n in before):
        return
    gen = next((n for n in sorted(before) if nodes[n].role == "generator"), None)
    shown = " -> ".join(nx.shortest_path(stream, gen, update.name)) if gen else ", ".join(sorted(before))
    errors.add(f"'{update.name}' trains samples no reward node scored ({shown}): they have no advantages",
               where=f"nodes.{update.name}",
               fix=f"score them on the way: generate -> reward -> ... -> update, or join a reward branch into "
                   f"{update.name}")


def _zero_delay_order(nodes: dict[str, Node], edges: list[Edge]) -> list[str]:
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((e.src, e.dst) for e in edges if e.delay == 0)
    stream = nx.DiGraph((e.src, e.dst) for e in edges if not e.state)
    try:
        loop = nx.find_cycle(stream)
    except nx.NetworkXNoCycle:
        pass
    else:
        names = " -> ".join([u for u, _ in loop] + [loop[0][0]])
        raise GraphError(f"samples flow in a cycle {names}: a batch would circulate forever", where="edges",
                         fix="streams (Rollout, Batch) must flow one way; only weights may go back to generate")
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        order = {name: i for i, name in enumerate(nodes)}
        return list(nx.lexicographical_topological_sort(g, key=order.__getitem__))
    names = [u for u, _ in cycle] + [cycle[0][0]]
    raise GraphError(f"zero-delay cycle {' -> '.join(names)}: it would deadlock", where="edges",
                     fix=f"put delay: 1 on one of its edges (usually {names[-2]} -> {names[-1]}), "
                         "or use schedule.mode sync/one_step_off/async to insert the delays")


def _joins_aligned(nodes: dict[str, Node], edges: list[Edge], errors: Problems) -> None:
    depth = arrival(nodes, edges)
    for n in nodes.values():
        ins = [e for e in edges if e.dst == n.name and not e.state]
        if len({depth[e.src] + e.delay for e in ins}) > 1:
            shown = "; ".join(f"{e.src} -> {e.dst} brings the batch of step t - {depth[e.src] + e.delay}" for e in ins)
            errors.add(f"'{n.name}' would join batches of different steps ({shown})", where=f"nodes.{n.name}",
                       fix="give the branches into it the same total delay (with schedule.mode the delays are "
                           "inserted where rollout work hands over to trainer work, on every branch alike)")


def _rates(nodes: dict[str, Node], edges: list[Edge], errors: Problems) -> None:
    for n in nodes.values():
        if n.every > 1:
            stream = [e for e in edges if e.dst == n.name and not e.state]
            if stream:
                errors.add(f"fires every {n.every} iterations but consumes the stream {stream[0].arrow}: "
                           "batches would be lost", where=f"nodes.{n.name}.every",
                           fix="only nodes whose inputs are all weights (like sync) may fire less often")


# ---------------------------------------------------------------- batch, placement, references


def _batch_arithmetic(spec: GraphSpec, nodes: dict[str, Node], errors: Problems) -> None:
    t = spec.task
    samples = t.prompts * t.samples_per_prompt
    for n in nodes.values():
        actors = spec.pools[n.pool].actors if n.pool in spec.pools else 1
        if n.role == "generator" and t.prompts % actors:
            errors.add(f"{t.prompts} prompts do not split evenly over the {actors} actors of pool '{n.pool}'",
                       where="task.prompts", fix=f"use a multiple of {actors} prompts or change pools.{n.pool}.actors")
        if n.role in TRAINER_ROLES and samples % actors:
            errors.add(f"{t.prompts} prompts x {t.samples_per_prompt} samples = {samples} samples do not split "
                       f"evenly over the {actors} data-parallel ranks of pool '{n.pool}'", where="task.samples_per_prompt",
                       fix=f"make prompts x samples_per_prompt a multiple of {actors}")
        if n.role == "trainer" and getattr(n.spec, "mini_batch_size", None) is not None:
            mb = n.spec.mini_batch_size
            if mb > samples or samples % mb:
                errors.add(f"mini_batch_size {mb} does not divide the batch of {samples} samples",
                           where=f"nodes.{n.name}.mini_batch_size", fix=f"use a divisor of {samples}")
            elif mb % actors:
                errors.add(f"mini_batch_size {mb} does not split over {actors} data-parallel ranks",
                           where=f"nodes.{n.name}.mini_batch_size", fix=f"use a multiple of {actors}")


def _placement(spec: GraphSpec, cluster: dict[str, float] | None, errors: Problems) -> None:
    for name, p in spec.pools.items():
        if p.gpus > 1 and not float(p.gpus).is_integer():
            errors.add(f"{p.gpus} GPUs per actor: more than one GPU must be a whole number",
                       where=f"pools.{name}.gpus", fix=f"use {math.floor(p.gpus)} or a fraction below 1")
        if p.cpus == 0 and p.gpus == 0:
            errors.add("an actor needs some resources", where=f"pools.{name}", fix="set cpus: 1 (or gpus)")
        if p.sharding != "none" and spec.runtime.executor == "local":
            errors.add(f"pool '{name}' is sharded ({p.sharding}): each rank is a process of its own in a "
                       "process group", where="runtime.executor", fix=f"use the ray or ray-tasks executor, or "
                       f"pools.{name}.sharding: none")
    if not cluster:
        return
    for res in ("cpus", "gpus"):
        want = sum(p.actors * getattr(p, res) for p in spec.pools.values())
        have = cluster.get(res)
        if have is not None and want > have + 1e-9:
            detail = ", ".join(f"{n}: {p.actors} x {getattr(p, res):g}" for n, p in spec.pools.items())
            errors.add(f"the pools ask for {want:g} {res} ({detail}) but the cluster has {have:g}",
                       where="pools", fix=f"lower pools.*.{res} or actors, or join a larger cluster (--address)")


def _weights_paths(spec: GraphSpec, nodes: dict[str, Node], edges: list[Edge], errors: Problems) -> None:
    """Every exporter's weights path, and every data edge's path, can be had (the plan asks
    :func:`omnigraph.transports.choose` and :func:`~omnigraph.transports.choose_data` again)."""
    for n in nodes.values():
        if n.role == "exporter":
            try:
                path = transports.choose(spec, n.name)
                given = getattr(n.spec, "transport_options", None)
                # the path's class is loaded only to validate options given (a transport module imports torch)
                cls = plugins.load("transports", path, where=f"nodes.{n.name}") if given else None
            except GraphError as e:
                errors.extend(e)
                continue
            for problem in plugins.typed_options(cls, given, f"nodes.{n.name}.transport_options",
                                                 kind=f"weights path {path}")[1] if given else []:
                errors.extend(problem)
    for e in edges:
        if not e.state:
            try:
                transports.choose_data(spec, e.transport, spec.edges[e.index].arrow)
            except GraphError as err:
                errors.extend(err)
