"""PNG plots of a finished training run, drawn from the files in its run directory.

``plot_run`` reads ``metrics.jsonl``, ``config.yaml`` and (if present)
``timeline.jsonl`` and writes next to them:

* ``reward.png``: training reward per step (band of +- ``reward_std``) and the
  held-out greedy eval points, with turns and tool calls per episode on a second
  axis for multi-turn runs; skipped when no row has ``reward_mean``.
* ``timing.png``: per-step stacked node compute times (``timing_s/<node>``),
  the measured ``step_s``, and a small panel with the trainer's wait for
  samples (``timing_s/gen``) and ``timing_s/update_weights``.
* ``partial.png`` (partial rollouts): per step, the prompt groups a generator
  carried to its next firing and the share of trained tokens sampled in an
  earlier firing; below, spans per sample and per-token staleness against the
  proven bound.
* ``timeline.png``: the measured pipeline, a lane per actor and a box per node
  run, for steps 1..12 (the warm-up step is left out); the parts a node marked
  (``ctx.span``: a multi-turn episode's turns and environment waits) as a thin
  strip under its box; skipped without ``timeline.jsonl``.

Example::

    >>> from omnigraph.viz.plots import plot_run
    >>> plot_run("/tmp/runs/grpo-one-step-off-20261129-162333")  # doctest: +SKIP
    [PosixPath('.../reward.png'), PosixPath('.../timing.png')]
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..records import read_jsonl  # noqa: E402

WAITS = ("timing_s/gen", "timing_s/update_weights")  # not node compute: the lower timing panel
MAX_STEPS = 12
DPI = 110


def _num(row: dict[str, Any], key: str) -> float | None:
    """``row[key]`` as a finite float, else None (missing, null, NaN, not a number)."""
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _title(run_dir: Path) -> str:
    """``name (mode)`` from ``config.yaml``; the directory name when the file is missing or odd."""
    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    sched = cfg.get("schedule") if isinstance(cfg.get("schedule"), dict) else {}
    return f"{cfg.get('name') or run_dir.name} ({sched.get('mode') or '?'})"


def _reward(rows: list[dict[str, Any]], title: str, out: Path) -> bool:
    pts = [(r["step"], _num(r, "reward_mean"), _num(r, "reward_std")) for r in rows
           if _num(r, "reward_mean") is not None]
    if not pts:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], color="tab:blue", lw=1.5, label="train reward (mean)")
    band = [p for p in pts if p[2] is not None]
    if band:
        ax.fill_between([p[0] for p in band], [p[1] - p[2] for p in band], [p[1] + p[2] for p in band],
                        color="tab:blue", alpha=0.18, lw=0, label="train reward +- std")
    ev = [(r["step"], _num(r, "eval_reward")) for r in rows if _num(r, "eval_reward") is not None]
    if ev:
        ax.plot([e[0] for e in ev], [e[1] for e in ev], "o--", color="tab:orange", ms=6, lw=1,
                label="eval (greedy, held-out)")
    ax.set(xlabel="step", ylabel="reward", title=f"{title}: reward")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(color="#dddddd", lw=0.6)
    handles, labels = ax.get_legend_handles_labels()
    turns = [(r["step"], _num(r, "turns_mean"), _num(r, "tool_calls_per_episode")) for r in rows
             if _num(r, "turns_mean") is not None]
    if turns:                               # multi-turn episodes: turns and tool calls on a second axis
        ax2 = ax.twinx()
        ax2.plot([t[0] for t in turns], [t[1] for t in turns], color="tab:green", lw=1.2, label="turns per episode")
        ax2.plot([t[0] for t in turns], [t[2] or 0.0 for t in turns], ":", color="tab:purple", lw=1.2,
                 label="tool calls per episode")
        ax2.set_ylabel("per episode")
        ax2.set_ylim(bottom=0)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return True


def _timing(rows: list[dict[str, Any]], title: str, out: Path) -> bool:
    nodes: list[str] = []  # node timing keys in order of first appearance
    for r in rows:
        nodes += [k for k in r if k.startswith("timing_s/") and k not in WAITS and k not in nodes]
    if not nodes and not any(_num(r, "step_s") is not None for r in rows):
        return False
    steps = [r["step"] for r in rows]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    cmap = plt.get_cmap("tab10")
    bottom = [0.0] * len(rows)
    for i, k in enumerate(nodes):
        h = [_num(r, k) or 0.0 for r in rows]
        ax.bar(steps, h, bottom=bottom, width=0.8, color=cmap(i % 10), label=k.split("/", 1)[1])
        bottom = [b + x for b, x in zip(bottom, h)]
    st = [(r["step"], _num(r, "step_s")) for r in rows if _num(r, "step_s") is not None]
    if st:
        ax.plot([s[0] for s in st], [s[1] for s in st], "k.-", lw=1.2, ms=4, label="step_s (measured)")
    ax.set(ylabel="seconds", title=f"{title}: time per step (bars: node compute, summed)")
    ax.grid(axis="y", color="#dddddd", lw=0.6)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    for k, c in zip(WAITS, ("tab:red", "tab:purple")):
        pts = [(r["step"], _num(r, k)) for r in rows if _num(r, k) is not None]
        if pts:
            label = "gen (trainer waits for samples)" if k.endswith("/gen") else k.split("/", 1)[1]
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], ".-", color=c, ms=3, lw=1, label=label)
    ax2.set(xlabel="step", ylabel="seconds")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.grid(color="#dddddd", lw=0.6)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return True


def _timeline(recs: list[dict[str, Any]], title: str, out: Path) -> bool:
    recs = [r for r in recs if _num(r, "t_start") is not None and _num(r, "t_end") is not None
            and "step" in r and "node" in r]
    parts = [r for r in recs if "part" in r]
    recs = [r for r in recs if "part" not in r]
    steps = sorted({r["step"] for r in recs})
    if not steps:
        return False
    keep = set(steps[1:MAX_STEPS + 1] if len(steps) > 2 else steps[:MAX_STEPS])  # skip warm-up step
    recs = sorted((r for r in recs if r["step"] in keep), key=lambda r: r["t_start"])
    t0 = recs[0]["t_start"]
    actors = sorted({str(r.get("actor", "?")) for r in recs})
    lane = {a: i for i, a in enumerate(actors)}
    node_order = list(dict.fromkeys(str(r["node"]) for r in recs))
    cmap = plt.get_cmap("tab10")
    colour = {n: cmap(i % 10) for i, n in enumerate(node_order)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.8 * len(actors)))
    boxes = []
    for r in recs:
        x, w, y = r["t_start"] - t0, max(r["t_end"] - r["t_start"], 0.0), lane[str(r.get("actor", "?"))]
        ax.barh(y, w, left=x, height=0.6, color=colour[str(r["node"])], edgecolor="black", lw=0.4)
        boxes.append((x, w, y, [f"{r['node']} {r['step']}", str(r["step"])]))
    shades = {"env": "#ffbf00"}            # amber: apart from the tab10 node colours
    for r in parts:
        if r["step"] in keep:
            x, w, y = r["t_start"] - t0, max(r["t_end"] - r["t_start"], 0.0), lane[str(r.get("actor", "?"))]
            env = str(r["part"]).startswith("env")
            ax.barh(y + 0.38, w, left=x, height=0.14, color=shades["env"] if env else "#555555", lw=0)
    part_legend = ([Patch(color="#555555", label="model turn"), Patch(color=shades["env"], label="env wait")]
                   if parts else [])
    ax.set_yticks(range(len(actors)), actors)
    ax.set_ylim(len(actors) - 0.4, -0.6)
    ax.set(xlabel=f"seconds since step {min(keep)} started", ylabel="actor",
           title=f"{title}: measured timeline, steps {min(keep)}..{max(keep)}")
    ax.grid(axis="x", color="#dddddd", lw=0.6)
    ax.legend(handles=[Patch(color=colour[n], label=n) for n in node_order] + part_legend, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    for x, w, y, labels in boxes:  # keep the longest label that fits inside its box
        px = ax.transData.transform((x + w, y))[0] - ax.transData.transform((x, y))[0]
        for s in labels:
            t = ax.text(x + w / 2, y, s, ha="center", va="center", fontsize=7, color="white")
            if t.get_window_extent(renderer).width <= px - 2:
                break
            t.remove()
    fig.savefig(out, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return True


def _partial(rows: list[dict[str, Any]], title: str, bound: int | None, out: Path) -> bool:
    gen = [r for r in rows if _num(r, "carried_groups_out") is not None]
    if not gen:
        return False
    fig, (top, low) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, gridspec_kw={"height_ratios": [1, 1]})
    steps = [r["step"] for r in gen]
    top.bar(steps, [_num(r, "carried_groups_out") for r in gen], color="tab:purple", alpha=0.6,
            label="groups carried to the next firing")
    top.set_ylabel("prompt groups")
    share = top.twinx()
    share.plot(steps, [(_num(r, "carried_tokens") or 0) / max(1.0, _num(r, "returned_tokens") or 0) for r in gen],
               color="tab:green", lw=1.2, label="returned tokens sampled in an earlier firing (share)")
    share.set_ylim(0, 1)
    h1, l1 = top.get_legend_handles_labels()
    h2, l2 = share.get_legend_handles_labels()
    top.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=8)
    top.set_title(f"{title}: partial rollouts")
    low.plot(steps, [_num(r, "spans_max") for r in gen], "o-", ms=3, color="tab:purple", lw=1, label="spans (max)")
    low.plot(steps, [_num(r, "spans_mean") for r in gen], color="tab:purple", lw=1, alpha=0.5, label="spans (mean)")
    tok = [r for r in rows if _num(r, "token_staleness_max") is not None]
    low.plot([r["step"] for r in tok], [_num(r, "token_staleness_max") for r in tok], "s-", ms=3, color="tab:red",
             lw=1, label="token staleness (max)")
    low.plot([r["step"] for r in tok], [_num(r, "token_staleness_mean") for r in tok], color="tab:red", lw=1,
             alpha=0.5, label="token staleness (mean)")
    if bound is not None:
        low.axhline(bound, color="black", ls="--", lw=0.8, label=f"proven bound {bound}")
    low.set(xlabel="step", ylabel="firings / versions")
    low.xaxis.set_major_locator(MaxNLocator(integer=True))
    low.legend(loc="upper right", fontsize=8)
    for ax in (top, low):
        ax.grid(color="#dddddd", lw=0.6)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return True


def _bound(run_dir: Path) -> int | None:
    """The proven staleness bound, from the run's ``plan.txt``."""
    try:
        for line in (run_dir / "plan.txt").read_text().splitlines():
            if line.startswith("staleness bound:"):
                return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        pass
    return None


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write ``reward.png``, ``timing.png``, ``partial.png`` and ``timeline.png`` into ``run_dir``; return those
    written."""
    run_dir = Path(run_dir)
    rows = sorted((r for r in read_jsonl(run_dir / "metrics.jsonl") if isinstance(r.get("step"), int)),
                  key=lambda r: r["step"])
    title = _title(run_dir)
    written = []
    for name, ok in (("reward.png", lambda p: _reward(rows, title, p)),
                     ("timing.png", lambda p: bool(rows) and _timing(rows, title, p)),
                     ("partial.png", lambda p: _partial(rows, title, _bound(run_dir), p)),
                     ("timeline.png", lambda p: _timeline(read_jsonl(run_dir / "timeline.jsonl"), title, p))):
        if ok(run_dir / name):
            written.append(run_dir / name)
    return written
