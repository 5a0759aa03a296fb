"""The rollout actor's ordering rule: a finished batch leaves the actor before the actor's next generation.

The UniRL async diffusion trainer owes its speed to one rule written by hand: reap and send the
finished generation before launching the next, so that the transfer never waits behind a queued
generation. Here an actor's tasks run in the plan's static order, step after step, and a value crosses
to another actor when the task that makes it ends. So the rule holds exactly when, on every actor that
runs a generator, each value that leaves the actor and derives from the generator's batch is made in the
same step as that batch: no delay on the path from the generator to the task that sends it (a delay there
would hold batch ``i`` on the actor until step ``i + d``, after generation ``i + 1``). A delay on the edge
that crosses actors is a buffer on the receiving side, and costs the sender nothing.

>>> import omnigraph as og
>>> plan = og.compile("graphs/grpo_one_step_off.yaml")
>>> queued_transfers(plan)
[]
>>> senders(plan)["rollout.0"]
{'reward': ['trainer.0']}
"""

from __future__ import annotations


def _runs_on(plan) -> dict[str, set[str]]:
    return {actor: {t.node for t in tasks if t.op == "run"} for actor, tasks in plan.order.items()}


def senders(plan) -> dict[str, dict[str, list[str]]]:
    """Per actor: each node whose output crosses to other actors, with those actors (data edges)."""
    out: dict[str, dict[str, list[str]]] = {}
    for c in plan.channels:
        if c.src.actor != c.dst.actor and not c.edge.state and c.src.op == "run":
            dsts = out.setdefault(c.src.actor, {}).setdefault(c.src.node, [])
            if c.dst.actor not in dsts:
                dsts.append(c.dst.actor)
    return out


def queued_transfers(plan) -> list[str]:
    """Every way the plan breaks the rule (module docstring), as a sentence; empty when it holds."""
    graph = plan.graph
    runs = _runs_on(plan)
    problems = []
    for actor, nodes in runs.items():
        for gen in sorted(n for n in nodes if graph.nodes[n].role == "generator"):
            held = {gen: 0}                      # node on this actor -> delay on the path from the generator
            frontier = [gen]
            while frontier:
                node = frontier.pop()
                for e in graph.outputs_of(node):
                    if e.state:
                        continue
                    if e.dst in nodes:
                        d = held[node] + e.delay
                        if d > held.get(e.dst, -1):
                            held[e.dst] = d
                            frontier.append(e.dst)
                    elif held[node] > 0:
                        problems.append(
                            f"actor {actor} sends {node}'s output (of {gen}'s batch) to {e.dst} {held[node]} step(s) "
                            f"after generating it, behind its next {gen}: the delay sits on the path within {actor}; "
                            f"move it to the edge {node} -> {e.dst}, which crosses actors")
    return problems
