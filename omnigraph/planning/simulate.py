"""``omnigraph plan --timings RUN ... --simulate``: the layout advisor on paper, from 8 to 1,024 devices.

Each node's time on ``d`` devices comes from the fitted scaling model of :mod:`.layouts` (``t(d) = a + b/d``,
one point per run given). What a bigger cluster adds is the link: a layout whose rollout and trainer are
separate pools sends the weights across it every sync, which the link model prices as

    seconds = latency + bytes x delta_fraction / bandwidth

(``bytes``: the runs' median ``sync_bytes`` unless ``--weights-gb`` says; ``delta_fraction``: the share of the
bytes a sync sends, 1 for dense weights, the changed fraction for delta sync). A colocated pool reloads its
weights in place: no link. For each size, the colocated layout and separate splits of 1/8 to 7/8 of the devices
to the rollout are compiled under ``sync``, ``one_step_off`` and ``async`` ahead 2 (so the staleness bound is
the compiler's proof) and list-scheduled; the fastest within ``schedule.max_staleness`` is picked as
:func:`.layouts.recommend` picks, and the report says where its step goes: each pool's busy share, and the
weights' seconds on the link.

What ranks layouts is the inputs, stated. A trainer-bound workload (training seconds well above generation's
on the same devices) favours colocated: all devices train, and generation borrows them. A node with a large
fixed part ``a`` (a long-tail decode that more devices do not shorten) favours a separate rollout pool, as
does a schedule that overlaps the pools; a slow link, or large weights, takes that back unless delta sync
makes the bytes few.

>>> Link(10.0, 2.0, 0.05).seconds(4e9)
0.022
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import GraphError
from ..graph.ports import ROLE
from .compile import compile
from .layouts import LAYOUT_SCHEDULES, Layout, Scaling, devices_of, recommend, repool
from .whatif import label, read_run, variant

SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
SPLITS = (1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4, 7 / 8)


@dataclass
class Link:
    """The path the weights take between separate pools: ``gbps`` GB/s, ``latency_ms`` per sync, and the share of
    the bytes a sync sends (``delta``: 1 for dense weights)."""

    gbps: float = 25.0
    latency_ms: float = 1.0
    delta: float = 1.0

    def seconds(self, nbytes: float) -> float:
        return round(self.latency_ms / 1e3 + nbytes * self.delta / (self.gbps * 1e9), 6)

    @classmethod
    def parse(cls, text: str, delta: float) -> "Link":
        """``GBPS`` or ``GBPS,LATENCY_MS`` (``--link``)."""
        try:
            parts = [float(x) for x in text.split(",")]
            if not 1 <= len(parts) <= 2 or parts[0] <= 0 or min(parts) < 0:
                raise ValueError
        except ValueError:
            raise GraphError(f"--link {text!r}: expected GBPS or GBPS,LATENCY_MS (positive numbers)",
                             where="--link", fix="e.g. --link 25,1 (25 GB/s, 1 ms a sync)") from None
        if not 0 < delta <= 1:
            raise GraphError(f"--delta {delta}: the share of the bytes a sync sends is in (0, 1]", where="--delta",
                             fix="1 for dense weights; the changed fraction (e.g. 0.03) for delta sync")
        return cls(parts[0], parts[1] if len(parts) > 1 else 1.0, delta)


@dataclass
class Size:
    devices: int
    best: Layout | None
    colocated: Layout | None                   # the best colocated row, to compare with
    link_s: float                              # the weights' seconds on the link in a separate layout
    busy: dict[str, float] = field(default_factory=dict)   # the best layout's pools: busy share of the step
    layouts: list[Layout] = field(default_factory=list)    # every layout and schedule predicted


def weights_bytes(run_dirs: list[str]) -> float:
    """The median ``sync_bytes`` the runs logged (0 where none did)."""
    seen = [r["sync_bytes"] for d in run_dirs for r in read_run(d)[0] if isinstance(r.get("sync_bytes"), (int, float))]
    return float(statistics.median(seen)) if seen else 0.0


def splits(n: int) -> list[int | None]:
    return [None, *sorted({max(1, min(n - 1, round(f * n))) for f in SPLITS})] if n > 1 else [None]


def simulate(spec, scaling: dict[str, Scaling], link: Link, nbytes: float, sizes=SIZES) -> list[Size]:
    """For each size in ``sizes``: the recommended layout among the colocated one and the separate splits."""
    if not scaling:
        raise GraphError("no node times to simulate from", where="--timings", fix="pass a run directory of this graph")
    wire = link.seconds(nbytes)
    out = []
    for n in sizes:
        rows, busy = [], {}
        for split in splits(n):
            placed = repool(spec, split, n)
            devices = {p: int(devices_of(s)) for p, s in placed.pools.items()}
            t = {x: scaling[x].at(devices[placed.nodes[x].pool]) for x in placed.nodes if x in scaling}
            if split is not None:              # the weights cross the link once a sync
                for x, node in placed.nodes.items():
                    if ROLE[node.kind] == "exporter":
                        t[x] = t.get(x, 0.0) + wire
            name = f"colocated {n}" if split is None else f"separate {split}+{n - split}"
            for mode, ahead in LAYOUT_SCHEDULES:
                try:
                    plan = compile(variant(placed, mode, ahead), timings=t)
                except GraphError:
                    continue
                p = plan.prediction
                row = Layout(name, label(mode, ahead), plan.bound, round(p.step_s, 6), devices,
                             max(p.utilisation, key=p.utilisation.get) if p.utilisation else "-")
                rows.append(row)
                busy[id(row)] = {a: round(u, 3) for a, u in p.utilisation.items()}
        best = recommend(rows, spec.schedule.max_staleness)
        ok = [r for r in rows if r.layout.startswith("colocated") and r.staleness_bound <= spec.schedule.max_staleness]
        out.append(Size(n, best, min(ok, key=lambda r: r.predicted_s) if ok else None, wire,
                        busy.get(id(best), {}), rows))
    return out


def format_table(spec, scaling: dict[str, Scaling], link: Link, nbytes: float, rows: list[Size]) -> str:
    lines = [f"'{spec.name}' on paper: node times t(d) = a + b/d from the runs given; weights {nbytes / 1e9:.3g} GB "
             f"a sync over a link of {link.gbps:g} GB/s and {link.latency_ms:g} ms, a share {link.delta:.3g} of the bytes "
             f"sent: {rows[0].link_s if rows else 0:.4f} s a sync between separate pools",
             "  " + "  ".join(f"{n}: a {s.a:.4g} b {s.b:.4g}" for n, s in scaling.items()), "",
             f"  {'devices':>7}  {'recommended':<20} {'schedule':<14} {'bound':>5} {'s/step':>9} "
             f"{'colocated s/step':>16}  where the step goes"]
    for r in rows:
        if r.best is None:
            lines.append(f"  {r.devices:>7}  no layout keeps within schedule.max_staleness "
                         f"{spec.schedule.max_staleness}")
            continue
        b = r.best
        col = f"{r.colocated.predicted_s:>16.4g}" if r.colocated else f"{'-':>16}"
        where = ", ".join(f"{a} {u:.0%} busy" for a, u in r.busy.items())
        if not b.layout.startswith("colocated"):
            where += f"; weights {r.link_s:.3g} s on the link a sync"
        lines.append(f"  {r.devices:>7}  {b.layout:<20} {b.schedule:<14} {b.staleness_bound:>5} "
                     f"{b.predicted_s:>9.4g} {col}  {where}")
    return "\n".join(lines)


def as_json(scaling: dict[str, Scaling], link: Link, nbytes: float, rows: list[Size]) -> dict[str, Any]:
    return {"link": asdict(link), "weights_bytes": nbytes, "link_s": rows[0].link_s if rows else 0.0,
            "scaling": {n: {"a": round(s.a, 6), "b": round(s.b, 6)} for n, s in scaling.items()},
            "sizes": [{"devices": r.devices, "layouts": [asdict(x) for x in r.layouts], "busy": r.busy,
                       "recommended": asdict(r.best) if r.best else None,
                       "colocated": asdict(r.colocated) if r.colocated else None} for r in rows]}


def parse_sizes(text: str | None) -> tuple[int, ...]:
    """``--sizes 8,64,1024`` (default: the powers of two from 8 to 1,024)."""
    if not text:
        return SIZES
    try:
        sizes = tuple(int(x) for x in text.split(","))
        if not sizes or min(sizes) < 1:
            raise ValueError
    except ValueError:
        raise GraphError(f"--sizes {text!r}: expected device counts such as 8,64,1024", where="--sizes",
                         fix="comma-separated whole numbers, each at least 1") from None
    return sizes

