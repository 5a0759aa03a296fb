"""``omnigraph plan --timings RUN_DIR --devices N``: which split of N devices, under which schedule.

The layouts of N devices (CPU cores, or GPUs for a graph whose pools have GPUs) are

* ``colocated N``: one pool of N devices runs every node, one after another;
* ``separate k+(N-k)``: the rollout pool (the generators and scorers) on k devices, the trainer pool (every
  other node) on the rest, for k = 1 .. N-1;

each under ``sync``, ``one_step_off`` and ``async`` ahead 2. For each, the graph is re-pooled, compiled (so the
staleness bound is the compiler's proof, not an estimate) and list-scheduled (:mod:`.predict`) with node times
scaled to the pool's devices.

The scaling model, stated: a node's time on d devices is ``t(d) = a + b / d``. One run gives one point per
node, and then ``a = 0`` (time in inverse proportion to the devices). Several runs (``--timings`` more than
once) with the node on pools of different sizes give the fit by least squares: ``a`` is the part that does
not speed up with devices (a long-tail decode, a per-call overhead), and ``efficiency`` is how much of the
ideal 1/d speed-up a second device gave. Under the pure 1/d model a colocated layout never loses
(``max(G/k, T/(N-k)) >= (G+T)/N``); a separate split wins when a node's fixed part ``a`` keeps it from using
more devices, which is what a long-tail generation does.

A run's measured s/step beyond what its node times predict (channels, waits, the driver) is added to the
predictions of layouts with as many pools (the mean over such runs; else over all runs).

The recommendation is the fastest layout whose staleness bound is within ``schedule.max_staleness``; a layout
within 2% of it that is less stale, or has fewer pools, is preferred (the difference is noise).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import GraphError
from ..graph.ports import ROLE
from .compile import compile
from .whatif import label, node_times, variant

LAYOUT_SCHEDULES = (("sync", None), ("one_step_off", None), ("async", 2))
ROLLOUT_ROLES = ("generator", "scorer")
TIE = 0.02


@dataclass
class Scaling:
    """``t(d) = a + b / d`` for one node, from ``points`` (devices, seconds)."""

    a: float
    b: float
    points: list[tuple[float, float]] = field(default_factory=list)

    def at(self, devices: float) -> float:
        return self.a + self.b / devices

    @property
    def efficiency(self) -> float | None:
        """Of two devices: the speed-up over one, as a fraction of 2x (None: one point, 1/d assumed)."""
        if len({d for d, _ in self.points}) < 2:
            return None
        return round(self.at(1) / self.at(2) / 2, 3)

    @classmethod
    def fit(cls, points: list[tuple[float, float]]) -> "Scaling":
        xs = {d for d, _ in points}
        if len(xs) < 2:
            d, t = points[0]
            return cls(0.0, t * d, points)
        # least squares of t on 1/d, then kept physical: neither part negative
        u = [1.0 / d for d, _ in points]
        t = [s for _, s in points]
        mu, mt = sum(u) / len(u), sum(t) / len(t)
        var = sum((x - mu) ** 2 for x in u)
        b = sum((x - mu) * (y - mt) for x, y in zip(u, t)) / var
        a = mt - b * mu
        if b < 0:
            a, b = mt, 0.0
        elif a < 0:
            a, b = 0.0, sum(x * y for x, y in zip(u, t)) / sum(x * x for x in u)
        return cls(a, b, points)


@dataclass
class Layout:
    layout: str
    schedule: str
    staleness_bound: int
    predicted_s: float | None
    devices: dict[str, int]
    bottleneck: str = "-"
    overhead_s: float = 0.0
    """Included in ``predicted_s``: what runs with as many pools measured beyond their node times."""
    error: str | None = None
    recommended: bool = False


def devices_of(pool) -> float:
    """A pool's devices: its GPUs when it has some, else its CPU cores, over all its actors."""
    return pool.actors * (pool.gpus if pool.gpus > 0 else pool.cpus)


def fit_scaling(spec, run_dirs: list[str]) -> tuple[dict[str, Scaling], list[dict[str, Any]]]:
    """Per node of ``spec``: its scaling from every run's measured node time and the devices of the pool it ran
    on; and one line per run (its directory, layout and measured s/step)."""
    points: dict[str, list[tuple[float, float]]] = {}
    runs, specs = [], []
    for run_dir in run_dirs:
        timings, measured, ran, _ = node_times(spec, run_dir)
        specs.append(ran)
        for name, t in timings.items():
            if name in spec.nodes and name in ran.nodes and ran.nodes[name].pool in ran.pools:
                points.setdefault(name, []).append((devices_of(ran.pools[ran.nodes[name].pool]), t))
        runs.append({"run": str(run_dir), "schedule": label(ran.schedule.mode, ran.schedule.ahead),
                     "pools": {p: devices_of(s) for p, s in ran.pools.items()}, "measured_s": measured})
    missing = [n for n in spec.nodes if n not in points]
    if len(missing) == len(spec.nodes):
        raise GraphError(f"no node of '{spec.name}' appears in the runs given", where="--timings",
                         fix="pass run directories of this graph (their config.yaml names its nodes)")
    scaling = {n: Scaling.fit(p) for n, p in points.items()}
    for r, ran in zip(runs, specs):      # what the node times leave out of each run (channels, waits, the driver)
        if r["measured_s"]:
            t = {n: scaling[n].at(devices_of(ran.pools[node.pool])) for n, node in ran.nodes.items() if n in scaling}
            r["overhead_s"] = round(r["measured_s"] - compile(ran, timings=t).prediction.step_s, 5)
    return scaling, runs


def overhead(runs: list[dict], pools: int) -> float:
    """The measured s/step the node times do not explain, from the runs with as many pools (else all runs)."""
    same = [r["overhead_s"] for r in runs if "overhead_s" in r and len(r["pools"]) == pools]
    every = [r["overhead_s"] for r in runs if "overhead_s" in r]
    pick = same or every
    return max(0.0, sum(pick) / len(pick)) if pick else 0.0


def repool(spec, split: int | None, n: int):
    """``spec`` on ``n`` devices: one pool (``split`` None) or rollout ``split`` + trainer ``n - split``. Each
    pool has one actor holding its devices: the scaling model stands for how its work spreads over them."""
    base = next(iter(spec.pools.values()))
    gpu = any(p.gpus > 0 for p in spec.pools.values())

    def pool(d: int):
        return base.model_copy(update={"actors": 1, "cpus": d if not gpu else base.cpus, "gpus": d if gpu else 0,
                                       "sharding": "none"})

    if split is None:
        pools = {"colocated": pool(n)}
        where = {name: "colocated" for name in spec.nodes}
    else:
        pools = {"rollout": pool(split), "trainer": pool(n - split)}
        where = {name: "rollout" if ROLE[node.kind] in ROLLOUT_ROLES else "trainer" for name, node in spec.nodes.items()}
    nodes = {name: node.model_copy(update={"pool": where[name]}) for name, node in spec.nodes.items()}
    return spec.model_copy(update={"pools": pools, "nodes": nodes})


def layouts(spec, scaling: dict[str, Scaling], n: int, runs: list[dict] = ()) -> list[Layout]:
    """Every layout of ``n`` devices under every schedule, predicted (plus the overhead the ``runs`` measured
    beyond their node times, from runs with as many pools); the recommended one marked."""
    if n < 1:
        raise GraphError(f"--devices {n}: a layout needs at least one device", where="--devices", fix="pass N >= 1")
    out: list[Layout] = []
    for split in [None, *range(1, n)]:
        name = f"colocated {n}" if split is None else f"separate {split}+{n - split}"
        placed = repool(spec, split, n)
        devices = {p: int(devices_of(s)) for p, s in placed.pools.items()}
        timings = {node: scaling[node].at(devices[placed.nodes[node].pool]) for node in placed.nodes if node in scaling}
        work = {p: sum(t for node, t in timings.items() if placed.nodes[node].pool == p) for p in placed.pools}
        busiest = max(work, key=work.get)          # the pool with the most seconds of work per step
        extra = overhead(list(runs), len(placed.pools))
        for mode, ahead in LAYOUT_SCHEDULES:
            try:
                plan = compile(variant(placed, mode, ahead), timings=timings)
            except GraphError as e:
                out.append(Layout(name, label(mode, ahead), -1, None, devices, error=str(e).splitlines()[0]))
                continue
            out.append(Layout(name, label(mode, ahead), plan.bound, round(plan.prediction.step_s + extra, 4),
                              devices, busiest, overhead_s=round(extra, 5)))
    pick = recommend(out, spec.schedule.max_staleness)
    if pick is not None:
        pick.recommended = True
    return out


def recommend(rows: list[Layout], max_staleness: int) -> Layout | None:
    ok = [r for r in rows if r.predicted_s is not None and r.staleness_bound <= max_staleness]
    if not ok:
        return None
    best = min(r.predicted_s for r in ok)
    near = [r for r in ok if r.predicted_s <= best * (1 + TIE)]
    return min(near, key=lambda r: (r.staleness_bound, len(r.devices), r.predicted_s))


def chosen_spec(spec, row: Layout):
    """The graph file for a layout: its pools (GPUs as one actor per GPU, CPUs as one actor with the cores)."""
    split = None if row.layout.startswith("colocated") else int(row.layout.split()[1].split("+")[0])
    n = sum(row.devices.values())
    placed = repool(spec, split, n)
    if any(p.gpus > 0 for p in spec.pools.values()):
        pools = {p: s.model_copy(update={"actors": int(s.gpus), "gpus": 1}) for p, s in placed.pools.items()}
        placed = placed.model_copy(update={"pools": pools})
    mode, ahead = ("async", int(row.schedule.split()[-1])) if row.schedule.startswith("async") else (row.schedule, None)
    schedule = spec.schedule.model_copy(update={"mode": mode, "ahead": ahead,
                                                "max_staleness": max(row.staleness_bound, 0)})
    edges = [e.model_copy(update={"delay": None}) for e in placed.edges]
    return placed.model_copy(update={"schedule": schedule, "edges": edges})


def format_table(spec, scaling: dict[str, Scaling], runs: list[dict], rows: list[Layout], n: int) -> str:
    lines = [f"layouts of {n} devices for '{spec.name}', from {len(runs)} run(s):"]
    for r in runs:
        pools = ", ".join(f"{p} {d:g}" for p, d in r["pools"].items())
        meas = f", measured {r['measured_s']:.3f} s/step" if r["measured_s"] else ""
        meas += f" ({r['overhead_s']:+.3f} beyond its node times)" if "overhead_s" in r else ""
        lines.append(f"  {r['run']}: {r['schedule']} on {pools}{meas}")
    lines.append("  node time on d devices, t(d) = a + b/d:")
    for name, s in scaling.items():
        eff = "1/d assumed (one point)" if s.efficiency is None else f"efficiency of a 2nd device {s.efficiency:.0%}"
        lines.append(f"    {name:<14} a {s.a:.4f}  b {s.b:.4f}  ({eff})")
    if any("overhead_s" in r for r in runs):
        lines.append("  each prediction includes the mean of that overhead over the runs with as many pools")
    lines += ["", f"  {'layout':<16} {'schedule':<14} {'staleness':>9} {'predicted s/step':>17}  bottleneck",
              f"  {'-' * 16} {'-' * 14} {'-' * 9} {'-' * 17}  {'-' * 12}"]
    for r in rows:
        if r.error:
            lines.append(f"  {r.layout:<16} {r.schedule:<14} not valid: {r.error[:80]}")
            continue
        mark = "  <- recommended" if r.recommended else ""
        lines.append(f"  {r.layout:<16} {r.schedule:<14} {r.staleness_bound:>9} {r.predicted_s:>17.3f}  "
                     f"{r.bottleneck}{mark}")
    pick = next((r for r in rows if r.recommended), None)
    lines.append("")
    lines.append(f"  recommended: {pick.layout}, {pick.schedule} (staleness bound {pick.staleness_bound}, within "
                 f"schedule.max_staleness {spec.schedule.max_staleness})" if pick else
                 f"  no layout keeps within schedule.max_staleness {spec.schedule.max_staleness}")
    return "\n".join(lines)


def as_json(scaling: dict[str, Scaling], runs: list[dict], rows: list[Layout]) -> dict[str, Any]:
    pick = next((r for r in rows if r.recommended), None)
    return {"runs": runs,
            "scaling": {n: {"a": round(s.a, 6), "b": round(s.b, 6), "efficiency": s.efficiency}
                        for n, s in scaling.items()},
            "layouts": [asdict(r) for r in rows],
            "recommended": {"layout": pick.layout, "schedule": pick.schedule,
                            "staleness_bound": pick.staleness_bound, "predicted_s": pick.predicted_s} if pick else None}
