"""``schedule.lend``: a second generator on the trainer's pool, in the trainer's idle window.

When generation takes longer than training, a one-step-off (or async) trainer waits for every batch. verl-omni
lends idle trainer GPUs to generation at run time; here it is a rewrite of the graph before it is compiled, so
the staleness proof and the plan cover it:

* ``generate_lent`` (a copy of the generator, ``lent: true``, on the trainer's pool) samples the last ``k`` of
  each step's prompts, the rollout the others (``prompt_share``);
* its weights edge from the exporter has delay 0 (:mod:`omnigraph.proof.delays`): it fires after the step's update and
  samples with the weights that update made, so its samples are trained at staleness 0;
* ``reward_lent`` (a copy of the scorer, on the trainer's pool) scores them, and its batch joins the rollout's
  at the trainer with the same delay: two shares of one step's prompt groups, concatenated.

The lent generator keeps its own copy of the model on the trainer's actor and loads the same export the rollout
gets (one in-place copy; no second export).

The share: per step the rollout works ``G + R`` (generation and scoring of all ``p`` prompts) and the trainer
``T``; with ``k`` lent the two are even when ``(1 - k/p)(G + R) = T + (k/p) L``, ``L`` the trainer's pool's time
for all ``p`` prompts, so ``k = p (G + R - T) / (G + R + L)``, rounded. Costs are the node times the compiler is
given (``omnigraph plan --timings``), else each node's ``cost``, else the defaults per role; ``L`` is
``schedule.lend_speed`` times ``G + R``, else the lent nodes' times where the timings come from a run that lent
(:func:`omnigraph.planning.whatif.node_times` gives every generator's and scorer's time as for all ``p``
prompts), else ``G + R`` scaled by the two pools' devices. ``lend: auto`` lends when the trainer is predicted
idle for at least ``lend_idle`` of the step.
"""

from __future__ import annotations

from typing import Any

from .. import plugins
from ..errors import GraphError
from ..graph.ports import ROLE
from .predict import DEFAULT_COST

SUFFIX = "_lent"


def _cost(spec, name: str, timings: dict[str, float] | None) -> float:
    node = spec.nodes[name]
    if timings and name in timings:
        return float(timings[name])
    return float(node.cost) if node.cost is not None else DEFAULT_COST.get(ROLE[node.kind], 0.1)


def _devices(pool) -> float:
    return pool.actors * (pool.gpus if pool.gpus > 0 else pool.cpus)


def speed(spec, g: str, pool: str, timings: dict[str, float] | None, busy: float) -> tuple[float, str]:
    """How much longer the trainer's pool takes per prompt than the rollout's, and where that came from."""
    if spec.schedule.lend_speed is not None:
        return spec.schedule.lend_speed, "schedule.lend_speed"
    lg, lr = g + SUFFIX, spec_scorer(spec, g) + SUFFIX
    if timings and lg in timings and busy > 0:
        return (timings[lg] + timings.get(lr, 0.0)) / busy, "measured"
    slower = _devices(spec.pools[spec.nodes[g].pool]) / max(_devices(spec.pools[pool]), 1e-9)
    return slower, "devices"


def spec_scorer(spec, g: str) -> str:
    return next(e.dst for e in spec.edges if e.src == g and spec.nodes.get(e.dst) is not None
                and spec.nodes[e.dst].kind == "reward")


def _refuse(why: str, fix: str = "set schedule.lend: false") -> GraphError:
    return GraphError(f"schedule.lend: {why}", where="schedule.lend", fix=fix)


def parts(spec) -> tuple[str, str, str, str]:
    """The generator, its scorer, the exporter that feeds it, and the trainer's pool; or a GraphError saying what
    lending needs."""
    gens = [n for n, s in spec.nodes.items() if s.kind == "generate" and not s.lent]
    if len(gens) != 1:
        raise _refuse(f"lending needs one generate node, the graph has {len(gens)}")
    g = gens[0]
    scorers = [e.dst for e in spec.edges if e.src == g and spec.nodes.get(e.dst) is not None
               and spec.nodes[e.dst].kind == "reward"]
    exporters = [e.src for e in spec.edges if e.dst == g and spec.nodes.get(e.src) is not None
                 and spec.nodes[e.src].kind == "sync"]
    if len(scorers) != 1 or len(exporters) != 1:
        raise _refuse(f"lending needs '{g}' to feed one reward node and take weights from one sync node")
    gen, pool = spec.nodes[g], spec.nodes[exporters[0]].pool
    if spec.schedule.mode == "sync":
        raise _refuse("a sync schedule has no idle trainer window to lend (the trainer waits for the batch it "
                      "trains, then the rollout waits for the weights)",
                      fix="set schedule.mode: one_step_off or async, or colocate both on one pool")
    if gen.pool == pool:
        raise _refuse(f"'{g}' already runs on the trainer's pool '{pool}'")
    if "lend" not in plugins.backend("generate", gen.backend, where=f"nodes.{g}.backend").capabilities:
        raise _refuse(f"lending copies generator '{g}' onto the trainer's pool, and its backend {gen.backend} "
                      "cannot run as a lent copy (no 'lend' capability)",
                      fix="use a backend that can (hf), or schedule.lend: false")
    if gen.partial is not None or gen.env is not None:
        raise _refuse(f"lending copies generator '{g}' onto the trainer's pool as single-turn, whole rollouts "
                      "(no partial, no env)")
    if spec.pools[pool].actors != 1 or spec.pools[gen.pool].actors != 1:
        raise _refuse("lending splits each step's prompts between one rollout actor and one trainer actor",
                      fix="use pools of one actor each, or schedule.lend: false")
    if spec.schedule.on_stale == "wait":
        raise _refuse("on_stale: wait regenerates on the trainer already", fix="use on_stale error or drop")
    return g, scorers[0], exporters[0], pool


def plan_lend(spec, timings: dict[str, float] | None = None) -> tuple[Any, dict[str, Any] | None, dict | None]:
    """``spec`` with the lent generator added when ``schedule.lend`` asks for it; what was decided (None: lend
    off); and the node times adjusted to the shares (for the prediction)."""
    mode = spec.schedule.lend
    if mode is False:
        return spec, None, timings
    g, r, x, pool = parts(spec)
    p = spec.task.prompts
    rollout_busy = _cost(spec, g, timings) + _cost(spec, r, timings)
    train = sum(_cost(spec, n, timings) for n, s in spec.nodes.items() if s.pool == pool)
    idle = max(0.0, rollout_busy - train)
    lg, lr = g + SUFFIX, r + SUFFIX
    slower, source = speed(spec, g, pool, timings, rollout_busy)
    k = round(p * idle / (rollout_busy * (1 + slower))) if rollout_busy > 0 else 0
    k = max(0, min(p - 1, k))
    info = {"mode": "auto" if mode == "auto" else "on", "generator": g, "pool": pool, "trainer_idle_s": round(idle, 4),
            "idle_fraction": round(idle / rollout_busy, 3) if rollout_busy else 0.0, "lent_prompts": 0,
            "prompts": p, "speed": round(slower, 3), "speed_from": source}
    if mode == "auto" and (info["idle_fraction"] < spec.schedule.lend_idle or k == 0):
        short = info["idle_fraction"] < spec.schedule.lend_idle
        info["reason"] = (f"the trainer is predicted idle {info['idle_fraction']:.0%} of a step, under "
                          f"schedule.lend_idle {spec.schedule.lend_idle:.0%}" if short else
                          f"the idle window holds no whole prompt of {p}")
        return spec, info, timings
    k = max(k, 1)
    info["lent_prompts"] = k
    if lg in spec.nodes or lr in spec.nodes:
        raise _refuse(f"the graph already has a node named '{lg}' or '{lr}'", fix="rename it")
    nodes = dict(spec.nodes)
    nodes[g] = spec.nodes[g].model_copy(update={"prompt_share": (0, p - k)})
    nodes[lg] = spec.nodes[g].model_copy(update={"pool": pool, "lent": True, "prompt_share": (p - k, p),
                                                 "eval_every": 0})
    nodes[lr] = spec.nodes[r].model_copy(update={"pool": pool})
    edges = list(spec.edges)
    for e in spec.edges:
        if e.src == x and e.dst == g:         # weights: delay 0 (the mode's for a lent generator)
            edges.append(e.model_copy(update={"dst": lg, "delay": 0 if spec.schedule.mode == "custom" else None}))
        elif e.src == g and e.dst == r:
            edges.append(e.model_copy(update={"src": lg, "dst": lr}))
        elif e.src == r:                      # into the trainer: the same delay as the rollout's share
            edges.append(e.model_copy(update={"src": lr}))
    shares = {g: (p - k) / p, r: (p - k) / p, lg: k / p * slower, lr: k / p * slower}
    base = {g: g, r: r, lg: g, lr: r}
    full = {n: _cost(spec, base[n], timings) for n in shares}
    if timings is not None:
        timings = {n: t for n, t in timings.items() if n not in (lg, lr)}
        timings.update({n: full[n] * shares[n] for n in shares if base[n] in timings})
    for n in shares:                          # the plan's estimate where no measured time is given
        if timings is None or n not in timings:
            nodes[n] = nodes[n].model_copy(update={"cost": round(full[n] * shares[n], 6)})
    return spec.model_copy(update={"nodes": nodes, "edges": edges}), info, timings
