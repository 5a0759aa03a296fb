"""``omnigraph plan GRAPH --timings RUN_DIR``: what a run's measured node times predict for each schedule.

A finished (or interrupted) run's ``metrics.jsonl`` holds every node's compute
seconds per step. Their medians over the steady state are the node costs; the
graph is then compiled once per schedule (``sync``, ``one_step_off``,
``async`` ahead 2, ...: the declared delays cleared, the mode's inserted) and
each plan's list schedule (:mod:`omnigraph.predict`) gives the step time,
next to the staleness bound the compiler proves for it. For the run's own
schedule the measured step time is shown too: the difference is what the
model leaves out (channels, waiting, the driver).

The rollout's loading of new weights (``timing_s/apply_weights``) runs on its
actor before it generates and is counted into ``generate``. Costs are taken as
measured on the run's pools: a schedule that puts more work side by side on
shared cores or one GPU would see them grow.

>>> from omnigraph.planning.whatif import steady_medians
>>> steady_medians([{"step": 0, "timing_s/a": 9.0}, {"step": 1, "timing_s/a": 1.0},
...                 {"step": 2, "timing_s/a": 3.0}], fill=0)
{'a': 2.0}
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import GraphError
from ..graph.ports import ROLE
from ..records import read_jsonl, steady
from .compile import compile, to_spec

WAITS = ("gen", "update_weights")
"""``timing_s/`` keys that are not a node's compute (``apply_weights`` is: the rollout's, see :func:`compare`)."""
SCHEDULES = (("sync", None), ("one_step_off", None), ("async", 2), ("async", 4))


@dataclass
class Row:
    schedule: str
    staleness_bound: int
    predicted_s: float | None       # None: the schedule does not compile (``error``)
    speedup: float | None           # against the run's schedule (else the graph's), both predicted
    bottleneck: str                 # the busiest actor
    utilisation: dict[str, float]
    measured_s: float | None = None
    current: bool = False
    error: str | None = None


def steady_medians(rows: list[dict[str, Any]], fill: int) -> dict[str, float]:
    """Node -> median compute seconds over the steady state (the fill and the first step left out)."""
    window = steady(rows, fill)
    keys = dict.fromkeys(k for r in window for k in r if k.startswith("timing_s/"))
    out = {}
    for k in keys:
        name = k.split("/", 1)[1]
        values = [r[k] for r in window if isinstance(r.get(k), (int, float))]
        if name not in WAITS and values:
            out[name] = statistics.median(values)
    return out


SHARES = {"encoder_share": "the vision tower", "prefill_share": "the prompts' prefill, the tower in it",
          "update_encoder_share": "the vision tower in the update"}
"""Shares of a node's time the nodes log (an image-text policy's), and what each is a share of."""


RATES = {"update_tokens_per_s": "{:,.0f} update tokens/s", "mfu": "MFU {:.1%}"}
"""The trainer's rates the update logs (``mfu`` on a GPU only), and how the table prints each."""


def steady_shares(rows: list[dict[str, Any]], fill: int, keys=SHARES) -> dict[str, float]:
    """The median over the steady state of each share in :data:`SHARES` (or ``keys``) the run logged."""
    window = steady(rows, fill)
    out = {}
    for k in keys:
        values = [r[k] for r in window if isinstance(r.get(k), (int, float))]
        if values:
            out[k] = round(statistics.median(values), 4)
    return out


def read_run(run_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    run = Path(run_dir)
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise GraphError(f"'{run_dir}' has no metrics.jsonl", where="--timings",
                         fix="pass a run directory printed by omnigraph run")
    rows = [r for r in read_jsonl(metrics) if isinstance(r.get("step"), int)]
    if len(rows) < 2:
        raise GraphError(f"'{run_dir}' has {len(rows)} step(s) of metrics: too few to time its nodes",
                         where="--timings", fix="let the run go a few steps further (schedule.iterations)")
    summary = run / "summary.json"
    return rows, (json.loads(summary.read_text()) if summary.is_file() else {})


def variant(spec, mode: str, ahead: int | None):
    """``spec`` under another schedule: declared delays cleared, any staleness allowed (the bound is reported)."""
    edges = [e.model_copy(update={"delay": None}) for e in spec.edges]
    schedule = spec.schedule.model_copy(update={"mode": mode, "ahead": ahead, "max_staleness": 1_000_000,
                                                "on_stale": "error"})
    return spec.model_copy(update={"edges": edges, "schedule": schedule})


def label(mode: str, ahead: int | None) -> str:
    return f"async ahead {ahead}" if mode == "async" else mode


def _key(schedule) -> tuple[str, int | None]:
    return schedule.mode, (schedule.ahead or 1 if schedule.mode == "async" else None)


def as_whole_steps(ran, timings: dict[str, float]) -> dict[str, float]:
    """A run that lent (``schedule.lend``) split each step's prompts between two generators and their scorers: their
    times scaled to all of a step's prompts (time in proportion to prompts), as the planner takes node times."""
    p = ran.task.prompts
    out = dict(timings)
    for name, node in ran.nodes.items():
        share = getattr(node, "prompt_share", None)
        if share is None or name not in out or share[1] <= share[0]:
            continue
        scale = p / (share[1] - share[0])
        out[name] *= scale
        for e in ran.edges:
            if e.src == name and e.dst in out and ran.nodes[e.dst].kind == "reward":
                out[e.dst] *= scale
    return out


def node_times(spec, run_dir: str | Path) -> tuple[dict[str, float], float | None, Any, int]:
    """A run's steady-state node costs (the rollout's weight loading counted into its generator), its measured
    s/step, the spec it ran (its ``config.yaml``, else ``spec``) and its number of steps."""
    rows, summary = read_run(run_dir)
    config = Path(run_dir) / "config.yaml"
    ran = compile(to_spec(config) if config.is_file() else spec)     # the run's fill and schedule
    timings = as_whole_steps(ran.graph.spec, steady_medians(rows, ran.fill))
    apply_s = timings.pop("apply_weights", 0.0)
    if not any(n in timings for n in spec.nodes):
        raise GraphError(f"no node of '{spec.name}' appears in {run_dir}/metrics.jsonl", where="--timings",
                         fix="pass the graph that run was made from (its config.yaml is in the run directory)")
    for name, node in spec.nodes.items():   # the rollout loads new weights on its actor, then generates
        if ROLE[node.kind] == "generator" and apply_s:
            timings[name] = timings.get(name, 0.0) + apply_s
    measured = summary.get("s_per_step")
    if measured is None:
        steps = [r["step_s"] for r in steady(rows, ran.fill) if "step_s" in r]
        measured = statistics.median(steps) if steps else None
    return timings, measured, ran.graph.spec, len(rows)


def compare(spec, run_dir: str | Path) -> tuple[dict[str, float], list[Row], dict[str, Any]]:
    """Node costs from ``run_dir`` and one predicted row per schedule: the graph's own first, then the
    others; the row of the run's own schedule (its ``config.yaml``) carries the measured step time."""
    timings, measured, ran, steps = node_times(spec, run_dir)
    rows_run, _ = read_run(run_dir)
    fill = compile(ran).fill
    shares, rates = steady_shares(rows_run, fill), steady_shares(rows_run, fill, RATES)
    missing = [n for n in spec.nodes if n not in timings]
    mine, theirs = _key(spec.schedule), _key(ran.schedule)
    custom = spec.schedule.mode == "custom"
    out = [_row(compile(spec, timings=timings), label(*mine) + (" (declared delays)" if custom else ""),
                measured, mine == theirs)]
    for mode, ahead in () if custom else SCHEDULES:
        if (mode, ahead) == mine:
            continue
        try:
            plan = compile(variant(spec, mode, ahead), timings=timings)
        except GraphError as e:
            out.append(Row(label(mode, ahead), -1, None, None, "-", {}, error=str(e)))
            continue
        out.append(_row(plan, label(mode, ahead), measured, (mode, ahead) == theirs))
    base = next((r.predicted_s for r in out if r.current), out[0].predicted_s)
    for r in out:
        r.speedup = round(base / r.predicted_s, 3) if r.predicted_s else None
    return {n: round(v, 6) for n, v in timings.items()}, out, {"missing": missing, "steps": steps, "shares": shares,
                                                      "trainer": rates}


def _row(plan, name: str, measured: float | None = None, current: bool = False) -> Row:
    p = plan.prediction
    util = {a: round(u, 3) for a, u in p.utilisation.items()}
    busiest = max(util, key=util.get) if util else "-"
    return Row(name, plan.bound, round(p.step_s, 4), 1.0, busiest, util,
               round(measured, 4) if current and measured is not None else None, current)


def format_table(spec, run_dir, timings: dict[str, float], rows: list[Row], info: dict[str, Any]) -> str:
    lines = [f"what-if for '{spec.name}', node times from {run_dir} ({info['steps']} steps; median seconds in the "
             "steady state):",
             "  " + "  ".join(f"{n} {v:.3f}" for n, v in timings.items())]
    if info["missing"]:
        lines.append(f"  not in the run (default costs): {', '.join(info['missing'])}")
    if info.get("shares"):                # an image-text policy: where its pictures' time goes
        lines.append("  pictures: " + "; ".join(f"{SHARES[k]} {v:.1%}" for k, v in info["shares"].items())
                     + " (of generate's time; the last of the update's)")
    if info.get("trainer"):
        lines.append("  trainer: " + ", ".join(RATES[k].format(v) for k, v in info["trainer"].items()))
    lines += ["", f"  {'schedule':<28} {'staleness':>9} {'predicted s/step':>17} {'vs the run':>12}  bottleneck",
              f"  {'-' * 28} {'-' * 9} {'-' * 17} {'-' * 12}  {'-' * 24}"]
    for r in rows:
        if r.error:
            lines.append(f"  {r.schedule:<28} not valid: {r.error.splitlines()[0][:90]}")
            continue
        name = r.schedule + (" (this run)" if r.current else "")
        busy = f"{r.bottleneck} ({r.utilisation.get(r.bottleneck, 0):.0%} busy)"
        lines.append(f"  {name:<28} {r.staleness_bound:>9} {r.predicted_s:>17.3f} {'x%.2f' % r.speedup:>12}  {busy}")
    cur = next((r for r in rows if r.current), None)
    if cur is not None and cur.measured_s:
        lines += ["", f"  measured: {cur.measured_s:.3f} s/step for this run's schedule, predicted {cur.predicted_s:.3f}: "
                      f"{cur.measured_s - cur.predicted_s:+.3f} s/step the node times do not explain "
                      "(channels, waits, the driver)"]
    return "\n".join(lines)


def as_json(timings, rows: list[Row], info) -> dict[str, Any]:
    return {"timings": timings, "missing": info["missing"], "steps": info["steps"], "shares": info.get("shares", {}),
            "trainer": info.get("trainer", {}), "schedules": [asdict(r) for r in rows]}
