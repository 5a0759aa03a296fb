"""The graph as text: Mermaid, Graphviz DOT and a plain ASCII picture.

Each renderer is a pure function of the plan: pools in YAML order (those that
hold a node), nodes in YAML order, edges in YAML order, so the output is
stable and tests pin it exactly. A delayed edge is drawn dotted or dashed and
labelled ``delay d``; the type of the value it carries labels every edge.

>>> from omnigraph.testing import canonical_spec
>>> from omnigraph.planning import compile
>>> print(to_ascii(compile(canonical_spec("sync"))).splitlines()[-1])
staleness bound: 0 (max_staleness 1000; sync -> generate delay 1)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..graph.ir import Edge, Node
    from ..planning import Plan

# words Mermaid reads as syntax, so they cannot be node ids
_MERMAID_RESERVED = {"end", "graph", "subgraph", "flowchart", "style", "class", "classDef",
                     "click", "linkStyle", "direction", "default", "call", "href"}


def mode_of(plan: "Plan") -> str:
    s = plan.graph.spec.schedule
    return s.mode + (f" (ahead {s.ahead})" if getattr(s, "ahead", None) else "")


def pools_of(plan: "Plan") -> dict[str, list["Node"]]:
    """Pool name -> its nodes, for the pools that hold at least one node."""
    out: dict[str, list[Node]] = {p: [] for p in plan.graph.spec.pools}
    for n in plan.graph.nodes.values():
        out.setdefault(n.pool, []).append(n)
    return {p: ns for p, ns in out.items() if ns}


def pool_caption(plan: "Plan", pool: str) -> str:
    p = plan.graph.spec.pools[pool]
    return f"{p.actors} actor{'s' if p.actors != 1 else ''}, cpus {p.cpus:g}, gpus {p.gpus:g}"


def node_caption(n: "Node") -> str:
    return n.kind + (f", every {n.every}" if n.every > 1 else "")


def edge_caption(e: "Edge", sep: str = ", ", delay: bool = True) -> str:
    """``Batch``, ``Batch, delay 1``; ports are named when they are not the type's own name."""
    default = e.type.lower()
    ports = "" if e.src_port == e.dst_port == default else f" ({e.src_port} -> {e.dst_port})"
    return e.type + ports + (f"{sep}delay {e.delay}" if e.delay and delay else "")


def is_back_edge(plan: "Plan", e: "Edge") -> bool:
    """An edge that points backwards in the zero-delay topological order (it closes a cycle)."""
    pos = {n: i for i, n in enumerate(plan.graph.topo)}
    return pos[e.src] >= pos[e.dst]


# ---------------------------------------------------------------- Mermaid

def _mermaid_ids(plan: "Plan") -> dict[str, str]:
    pools = {f"pool_{p}" for p in pools_of(plan)}
    ids: dict[str, str] = {}
    for name in plan.graph.nodes:
        mid = re.sub(r"\W", "_", name)
        if mid != name or mid in _MERMAID_RESERVED or mid in pools or not mid[:1].isalpha():
            mid = f"n_{mid}"
        while mid in ids.values() or mid in pools:
            mid += "_"
        ids[name] = mid
    return ids


def _mesc(text: str) -> str:
    """Mermaid's entity codes for the characters it would read as syntax or HTML."""
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def _mq(text: str) -> str:
    return f'"{_mesc(text)}"'


def to_mermaid(plan: "Plan") -> str:
    """A ``flowchart LR``: one subgraph per pool, dotted arrows for delayed edges."""
    ids = _mermaid_ids(plan)
    out = ["flowchart LR",
           f"    %% {plan.name}: mode {mode_of(plan)}, staleness bound {plan.bound}"]
    for pool, nodes in pools_of(plan).items():
        out.append(f"    subgraph pool_{re.sub(r'[^A-Za-z0-9_]', '_', pool)}"
                   f"[{_mq(f'{pool}: {pool_caption(plan, pool)}')}]")
        for n in nodes:
            out.append(f'        {ids[n.name]}["{_mesc(n.name)}<br/>{_mesc(node_caption(n))}"]')
        out.append("    end")
    for e in plan.graph.edges:
        arrow = "-.->" if e.delay else "-->"
        out.append(f"    {ids[e.src]} {arrow}|{_mq(edge_caption(e))}| {ids[e.dst]}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- Graphviz DOT

def _dq(text: str) -> str:
    """A quoted DOT string; a newline becomes DOT's ``\\n``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(plan: "Plan") -> str:
    """A Graphviz digraph: one cluster per pool, delayed edges dashed and labelled."""
    out = [f"digraph {_dq(plan.name)} {{",
           "    rankdir=LR;",
           "    labelloc=t;",
           f"    label={_dq(f'{plan.name}: mode {mode_of(plan)}, staleness bound {plan.bound}')};",
           '    node [shape=box, style="rounded,filled", fillcolor=white];']
    for pool, nodes in pools_of(plan).items():
        out.append(f"    subgraph {_dq('cluster_' + pool)} {{")
        out.append(f"        label={_dq(f'{pool}: {pool_caption(plan, pool)}')};")
        for n in nodes:
            out.append(f"        {_dq(n.name)} [label={_dq(n.name + chr(10) + node_caption(n))}];")
        out.append("    }")
    for e in plan.graph.edges:
        attrs = [f"label={_dq(edge_caption(e, sep=chr(10)))}"]
        if e.delay:
            attrs.append("style=dashed")
        if is_back_edge(plan, e):
            attrs.append("constraint=false")
        out.append(f"    {_dq(e.src)} -> {_dq(e.dst)} [{', '.join(attrs)}];")
    out.append("}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- ASCII

def to_ascii(plan: "Plan") -> str:
    """Pools and their nodes, then ``a --> b`` / ``a ==[delay d]==> b``, then the bound."""
    g, s = plan.graph, plan.graph.spec.schedule
    out = [f"graph {plan.name} (mode {mode_of(plan)})", ""]
    width = max(len(n) for n in g.nodes) + 2
    for pool, nodes in pools_of(plan).items():
        out.append(f"pool {pool} ({pool_caption(plan, pool)})")
        out.extend(f"  {('[' + n.name + ']').ljust(width)}  {node_caption(n)}" for n in nodes)
    arrows = [f"{e.src} {'==[delay %d]==>' % e.delay if e.delay else '-->'} {e.dst}" for e in g.edges]
    aw = max((len(a) for a in arrows), default=0)
    out += ["", "edges"]
    out.extend(f"  {a.ljust(aw)}  {edge_caption(e, delay=False)}" for a, e in zip(arrows, g.edges))
    out += ["", f"staleness bound: {plan.bound} (max_staleness {s.max_staleness}; "
                f"{plan.staleness.explanation})"]
    return "\n".join(out) + "\n"
