"""Validation: turn a :class:`GraphSpec` into a resolved :class:`~omnigraph.ir.Graph`, or say why not.

One pass, one check per function, every problem a :class:`GraphError` naming
the node, edge or field and the fix. The invariants (DESIGN.md):

1. zero-delay edges form a DAG;
2. the weight cycle ``update -> sync -> generate -> ... -> update`` exists and is unique;
3. port types match along every edge and every input is connected;
4. (staleness: :mod:`omnigraph.staleness`);
5. placement is feasible;
6. the batch arithmetic is consistent.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import networkx as nx

from .delays import assign_delays
from .errors import GraphError, GraphErrors
from .ir import Edge, Graph, Node
from .ports import compatible, signature
from .spec import GraphSpec

TRAINER_KINDS = ("old_logprob", "ref_logprob", "update")
MODEL_ALIASES = ("tiny", "smollm2-135m")


class _Errors:
    def __init__(self) -> None:
        self.items: list[GraphError] = []

    def add(self, message: str, where: str | None = None, fix: str | None = None) -> None:
        self.items.append(GraphError(message, where=where, fix=fix))

    def raise_if_any(self) -> None:
        if len(self.items) == 1:
            raise self.items[0]
        if self.items:
            raise GraphErrors(self.items)


def resolve(spec: GraphSpec, cluster: dict[str, float] | None = None) -> Graph:
    """Validate ``spec`` and return the resolved graph; raise :class:`GraphError` otherwise.

    ``cluster`` (``{"cpus": n, "gpus": m}``) are the resources available; when given,
    the pools must fit in them.
    """
    errors = _Errors()
    nodes = _nodes(spec, errors)
    edges = _edges(spec, nodes, errors)
    errors.raise_if_any()
    _inputs_connected(nodes, edges, errors)
    _structure(nodes, edges, errors)
    errors.raise_if_any()
    edges = assign_delays(spec, nodes, edges)
    topo = _zero_delay_order(nodes, edges)
    _rates(nodes, edges, errors)
    _batch_arithmetic(spec, nodes, errors)
    _placement(spec, cluster, errors)
    _weights_transport(spec, nodes, errors)
    _references(spec, nodes, errors)
    errors.raise_if_any()
    graph = Graph(name=spec.name, spec=spec, nodes=nodes, edges=edges, topo=topo)
    graph.warnings.extend(_overlap_warnings(spec, graph))
    return graph


# ---------------------------------------------------------------- nodes and edges


def _nodes(spec: GraphSpec, errors: _Errors) -> dict[str, Node]:
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
        nodes[name] = Node(name=name, kind=ns.kind, pool=ns.pool, inputs=dict(sig.inputs),
                           outputs=dict(sig.outputs), every=every, spec=ns)
    if not nodes:
        errors.add("the graph has no nodes", where="nodes",
                   fix="define generate, reward, old_logprob, update and sync (see graphs/grpo_one_step_off.yaml)")
    return nodes


def _edges(spec: GraphSpec, nodes: dict[str, Node], errors: _Errors) -> list[Edge]:
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
        if (es.dst, dp) in taken:
            errors.add(f"input {es.dst}.{dp} already has a producer ({taken[(es.dst, dp)]})", where=where,
                       fix="each input takes exactly one edge; remove one of them")
            continue
        taken[(es.dst, dp)] = es.arrow
        edges.append(Edge(src=es.src, src_port=sp, dst=es.dst, dst_port=dp, type=src.outputs[sp],
                          delay=-1 if es.delay is None else es.delay, transport=es.transport, index=i))
    return edges


def _src_port(node: Node, port: str | None, where: str, errors: _Errors) -> str | None:
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


def _dst_port(node: Node, dst_port: str | None, src_type: str, where: str, errors: _Errors) -> str | None:
    if dst_port is not None:
        if dst_port not in node.inputs:
            errors.add(f"node '{node.name}' has no input '{dst_port}' (inputs: {', '.join(node.inputs) or 'none'})",
                       where=where, fix="name one of its inputs")
            return None
        return dst_port
    fits = [p for p, t in node.inputs.items() if compatible(src_type, t)]
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


def _inputs_connected(nodes: dict[str, Node], edges: list[Edge], errors: _Errors) -> None:
    connected = {(e.dst, e.dst_port) for e in edges}
    for n in nodes.values():
        for port, typ in n.inputs.items():
            if (n.name, port) not in connected:
                makers = [m.name for m in nodes.values() if m.name != n.name and typ in m.outputs.values()]
                fix = (f"add an edge into it from a node with a {typ} output ({', '.join(makers)})" if makers
                       else f"add a node with a {typ} output and an edge from it to {n.name}.{port}")
                errors.add(f"input '{port}' ({typ}) is not connected", where=f"nodes.{n.name}", fix=fix)


# ---------------------------------------------------------------- structure


def _structure(nodes: dict[str, Node], edges: list[Edge], errors: _Errors) -> None:
    updates = [n for n in nodes.values() if n.kind == "update"]
    gens = [n for n in nodes.values() if n.kind == "generate"]
    if len(updates) != 1:
        errors.add(f"the graph needs exactly one update node, found {len(updates)}"
                   + (f" ({', '.join(n.name for n in updates)})" if updates else ""),
                   where="nodes", fix="keep one node of kind update (the policy trainer)")
    if not gens:
        errors.add("the graph has no generate node", where="nodes",
                   fix="add nodes.generate: {kind: generate, pool: rollout}")
    if len(updates) != 1 or not gens:
        return
    update = updates[0]
    for n in nodes.values():
        if n.kind == "old_logprob" and n.pool != update.pool:
            errors.add(f"old_logprob runs on pool '{n.pool}' but it reads the trainer's weights on pool "
                       f"'{update.pool}'", where=f"nodes.{n.name}.pool", fix=f"set pool: {update.pool}")
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
        elif not any(nodes[x].kind == "sync" for x in paths[0][1:-1]):
            errors.add(f"weights go from '{update.name}' to '{gen.name}' without a sync node",
                       where=f"nodes.{gen.name}", fix="route them through a node of kind sync: update -> sync -> generate")


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


def _rates(nodes: dict[str, Node], edges: list[Edge], errors: _Errors) -> None:
    for n in nodes.values():
        if n.every > 1:
            stream = [e for e in edges if e.dst == n.name and not e.state]
            if stream:
                errors.add(f"fires every {n.every} iterations but consumes the stream {stream[0].arrow}: "
                           "batches would be lost", where=f"nodes.{n.name}.every",
                           fix="only nodes whose inputs are all weights (like sync) may fire less often")


# ---------------------------------------------------------------- batch, placement, references


def _batch_arithmetic(spec: GraphSpec, nodes: dict[str, Node], errors: _Errors) -> None:
    t = spec.task
    samples = t.prompts * t.samples_per_prompt
    for n in nodes.values():
        actors = spec.pools[n.pool].actors if n.pool in spec.pools else 1
        if n.kind == "generate" and t.prompts % actors:
            errors.add(f"{t.prompts} prompts do not split evenly over the {actors} actors of pool '{n.pool}'",
                       where="task.prompts", fix=f"use a multiple of {actors} prompts or change pools.{n.pool}.actors")
        if n.kind in TRAINER_KINDS and samples % actors:
            errors.add(f"{t.prompts} prompts x {t.samples_per_prompt} samples = {samples} samples do not split "
                       f"evenly over the {actors} data-parallel ranks of pool '{n.pool}'", where="task.samples_per_prompt",
                       fix=f"make prompts x samples_per_prompt a multiple of {actors}")
        if n.kind == "update" and n.spec.mini_batch_size is not None:
            mb = n.spec.mini_batch_size
            if mb > samples or samples % mb:
                errors.add(f"mini_batch_size {mb} does not divide the batch of {samples} samples",
                           where=f"nodes.{n.name}.mini_batch_size", fix=f"use a divisor of {samples}")
            elif mb % actors:
                errors.add(f"mini_batch_size {mb} does not split over {actors} data-parallel ranks",
                           where=f"nodes.{n.name}.mini_batch_size", fix=f"use a multiple of {actors}")


def _placement(spec: GraphSpec, cluster: dict[str, float] | None, errors: _Errors) -> None:
    for name, p in spec.pools.items():
        if p.gpus > 1 and not float(p.gpus).is_integer():
            errors.add(f"{p.gpus} GPUs per actor: more than one GPU must be a whole number",
                       where=f"pools.{name}.gpus", fix=f"use {math.floor(p.gpus)} or a fraction below 1")
        if p.cpus == 0 and p.gpus == 0:
            errors.add("an actor needs some resources", where=f"pools.{name}", fix="set cpus: 1 (or gpus)")
    if not cluster:
        return
    for res in ("cpus", "gpus"):
        want = sum(p.actors * getattr(p, res) for p in spec.pools.values())
        have = cluster.get(res)
        if have is not None and want > have + 1e-9:
            detail = ", ".join(f"{n}: {p.actors} x {getattr(p, res):g}" for n, p in spec.pools.items())
            errors.add(f"the pools ask for {want:g} {res} ({detail}) but the cluster has {have:g}",
                       where="pools", fix=f"lower pools.*.{res} or actors, or join a larger cluster (--address)")


def _weights_transport(spec: GraphSpec, nodes: dict[str, Node], errors: _Errors) -> None:
    """Weights over NCCL (``omnigraph.weightsync``): only between whole GPUs, one receiving node per pool."""
    from .weightsync import choose_path
    for n in nodes.values():
        if n.kind != "sync":
            continue
        outs = [e for e in spec.edges if e.src == n.name and e.dst in nodes]
        path = choose_path(spec, n.name) if n.backend == "torch" else "none"
        for e in outs:
            if e.transport == "nccl" and path != "nccl":
                errors.add(f"transport: nccl on the weights edge {e.arrow} needs the pools of '{n.name}' and "
                           f"'{e.dst}' on whole GPUs of their own (gpus >= 1; here {spec.pools[n.pool].gpus:g} and "
                           f"{spec.pools[nodes[e.dst].pool].gpus:g}) and a torch sync node",
                           where=f"edges.{e.arrow}", fix="remove transport (auto picks the path) or give both "
                                                          "pools gpus: 1")
        pools = [nodes[e.dst].pool for e in outs]
        if path == "nccl" and len(set(pools)) < len(pools):
            errors.add(f"'{n.name}' sends its weights over NCCL to several nodes of one pool: each actor can "
                       "receive one broadcast per sync", where=f"nodes.{n.name}",
                       fix="send the weights to one node per pool, or set transport: shm on these edges")


def _data_parallel(spec: GraphSpec, n: Node, errors: _Errors) -> None:
    """Several trainer actors train as one (omnigraph.dataparallel): a process group between them."""
    pool = spec.pools[n.pool]
    if 0 < pool.gpus < 1:
        errors.add(f"data-parallel training over {pool.actors} trainer actors with {pool.gpus:g} GPU each: NCCL "
                   "needs each rank on a GPU of its own", where=f"pools.{n.pool}.gpus",
                   fix=f"set pools.{n.pool}.gpus: 1, or pools.{n.pool}.actors: 1")
    if spec.runtime.executor == "local":
        errors.add(f"data-parallel training over {pool.actors} trainer actors needs one process per actor",
                   where="runtime.executor", fix=f"use the ray or ray-tasks executor, or pools.{n.pool}.actors: 1")


def _references(spec: GraphSpec, nodes: dict[str, Node], errors: _Errors) -> None:
    from nodes.tasks import TASKS
    if spec.task.name not in TASKS and ":" not in spec.task.name:
        errors.add(f"unknown task '{spec.task.name}' (built in: {', '.join(TASKS)})", where="task.name",
                   fix="use a built-in task or a dotted path module:function")
    for n in nodes.values():
        if n.kind == "reward" and n.spec.backend == "python":
            _resolvable(n.spec.fn, f"nodes.{n.name}.fn", errors)
        if n.kind == "custom":
            _resolvable(n.spec.cls, f"nodes.{n.name}.cls", errors)
    for n in nodes.values():
        if n.kind == "generate" and n.spec.lora_serving == "merged" and n.backend != "vllm":
            errors.add(f"lora_serving: merged is a vllm backend option (this node uses backend {n.backend})",
                       where=f"nodes.{n.name}.lora_serving", fix="remove it, or set backend: vllm")
        if n.kind == "update" and n.backend == "torch" and spec.pools[n.pool].actors > 1:
            _data_parallel(spec, n, errors)
        if n.kind == "sync" and n.backend == "torch":
            lora = any(u.kind == "update" and u.spec.lora for u in nodes.values())
            if n.spec.payload == "lora" and not lora:
                errors.add("payload lora but the update node trains no LoRA adapters", where=f"nodes.{n.name}.payload",
                           fix="set payload: full, or give the update node lora: {r: 8}")
            if n.spec.payload == "full" and lora:
                errors.add("the update node trains LoRA adapters: send them, not the full weights",
                           where=f"nodes.{n.name}.payload", fix="set payload: lora")
    from .loggers import missing
    for name in spec.runtime.loggers:
        if missing(name):
            errors.add(f"logger '{name}' needs the {missing(name)} package, which is not installed",
                       where="runtime.loggers", fix=f"pip install {missing(name)} (or pip install -e '.[{name}]'), "
                                                    f"or remove {name} from runtime.loggers")
    real = [n for n in nodes.values() if n.backend not in ("synthetic", "python", "custom")]
    path = spec.model.path
    if real and path not in MODEL_ALIASES and not Path(path).expanduser().is_dir():
        errors.add(f"model directory '{path}' does not exist (node '{real[0].name}' uses backend "
                   f"{real[0].backend})", where="model.path",
                   fix=f"use one of {', '.join(MODEL_ALIASES)} or a local Hugging Face model directory")


def _resolvable(dotted: str, where: str, errors: _Errors) -> None:
    try:
        load_object(dotted)
    except GraphError as e:
        errors.add(e.message, where=where, fix=e.fix)


def load_object(dotted: str):
    """``package.module:attr`` -> the attribute; a clear GraphError if it cannot be found."""
    mod, sep, attr = dotted.partition(":")
    if not sep or not mod or not attr:
        raise GraphError(f"'{dotted}' is not a dotted path", fix="write it as package.module:name")
    try:
        module = importlib.import_module(mod)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise GraphError(f"cannot import module '{mod}': {type(e).__name__}: {e}",
                         fix="check the module name and that it is importable from the current directory") from None
    if not hasattr(module, attr):
        raise GraphError(f"module '{mod}' has no attribute '{attr}'", fix="check the name after ':'")
    return getattr(module, attr)


# ---------------------------------------------------------------- warnings


def _overlap_warnings(spec: GraphSpec, graph: Graph) -> list[str]:
    out = []
    update = graph.update
    if any(e.delay > 0 and not e.state for e in graph.edges):
        for gen in graph.of_kind("generate"):
            if gen.pool == update.pool:
                out.append(f"no overlap: {gen.name} and {update.name} share pool '{gen.pool}' (one actor runs them "
                           "one after another), so the asynchronous schedule buys no time: predicted step = sum; "
                           "put them on different pools to overlap")
    return out
