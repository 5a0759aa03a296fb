"""Mode sugar: the delays ``schedule.mode`` puts on the edges.

Asynchrony is not a trainer class, it is delays on edges:

- the **weight edge** into each generator (``sync -> generate``) gets delay 1
  (the weight cycle needs one; generate uses the weights of the previous step),
  except into a generator lent to the trainer's pool (``schedule.lend``): 0, it
  samples with the weights the update just made;
- the **data edges** where rollout work ends and trainer work begins get the
  mode's data delay: 0 for ``sync``, 1 for ``one_step_off``, k for ``async``
  with ``ahead: k``;
- every other edge gets 0.

"Where trainer work begins" follows from node roles alone, never from pools:
on the paths from a generator to the trainer, the first node whose role is
trainer work (``logprob``: ``old_logprob``/``ref_logprob``, or ``trainer``:
``update``); everything downstream of it on those paths is trainer work too.
So in ``generate -> reward -> old_logprob -> update`` the delay sits on
``reward -> old_logprob``, whether the nodes share one pool (colocated) or not,
and with ``reward`` feeding both ``old_logprob`` and ``ref_logprob`` (a join at
``update``) on both branches.

If no edge declares a delay, the mode's are used. If some do, each declared
delay must equal the mode's (the error names the edge that disagrees);
``mode: custom`` takes the declared delays as they are (undeclared = 0).
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from ..errors import GraphError, GraphErrors
from ..graph.ir import Edge, Node
from ..sdk import TRAINER_ROLES


def mode_delays(schedule, nodes: dict[str, Node], edges: list[Edge]) -> dict[int, int]:
    """Edge index -> the delay the schedule's mode implies (``{}`` for mode custom)."""
    k = schedule.data_delay
    if k is None:
        return {}
    out = {e.index: 0 for e in edges}
    for e in edges:
        if e.state and nodes[e.dst].role == "generator":
            # a lent generator (schedule.lend) runs after the update on the trainer's own pool: no delay
            out[e.index] = 0 if getattr(nodes[e.dst].spec, "lent", False) else 1
    for e in boundary_edges(nodes, edges):
        out[e.index] = k
    return out


def boundary_edges(nodes: dict[str, Node], edges: list[Edge]) -> list[Edge]:
    """The stream edges where rollout work hands over to trainer work."""
    trainer = next((n for n in nodes.values() if n.role == "trainer"), None)
    if trainer is None:
        return []
    stream = nx.DiGraph()
    stream.add_nodes_from(nodes)
    stream.add_edges_from((e.src, e.dst) for e in edges if not e.state)
    upstream = nx.ancestors(stream, trainer.name) | {trainer.name}
    found: dict[int, Edge] = {}
    for gen in (n for n in nodes.values() if n.role == "generator"):
        on_path = (nx.descendants(stream, gen.name) | {gen.name}) & upstream
        starts = {n for n in on_path if n != gen.name and nodes[n].role in TRAINER_ROLES}
        work = set(starts)
        for s in starts:
            work |= nx.descendants(stream, s) & on_path
        for e in edges:
            if not e.state and e.src in on_path - work and e.dst in work:
                found[e.index] = e
    return list(found.values())


def assign_delays(spec, nodes: dict[str, Node], edges: list[Edge]) -> list[Edge]:
    """Edges with their final delays (declared ones are ``>= 0``, undeclared ``-1`` on entry)."""
    schedule = spec.schedule
    implied = mode_delays(schedule, nodes, edges)
    if schedule.mode == "custom":
        return [dataclasses.replace(e, delay=max(e.delay, 0)) for e in edges]
    problems = []
    for e in edges:
        if e.delay >= 0 and e.delay != implied[e.index]:
            problems.append(GraphError(
                f"declares delay {e.delay} but schedule.mode {schedule.mode}"
                f"{f' (ahead {schedule.ahead})' if schedule.ahead else ''} puts delay {implied[e.index]} there",
                where=f"edges[{e.index}] ({e.src} -> {e.dst})",
                fix=f"remove the delay or make it {implied[e.index]}, or set schedule.mode: custom to take "
                    "the declared delays as they are"))
    if problems:
        raise problems[0] if len(problems) == 1 else GraphErrors(problems)
    return [dataclasses.replace(e, delay=implied[e.index]) for e in edges]
