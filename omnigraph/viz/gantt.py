"""The unrolled pipeline as a Gantt chart: one lane per actor, one box per task.

The boxes are the predicted schedule (:mod:`omnigraph.planning.predict`) of the first
few steps, fill included. Each ``generate`` box says the batch it makes and
the weights version it uses (``gen b3 v2``), each ``update`` box the batch it
trains and the trainer's version (``upd b2 v2``), both read from the
staleness proof (:mod:`omnigraph.proof.staleness`), so the picture shows at a
glance what runs in parallel and how stale each batch is. ``stash`` and
``apply`` tasks take no time and are drawn as ticks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from .text import mode_of  # noqa: E402

from ..planning.predict import predict  # noqa: E402

if TYPE_CHECKING:
    from ..planning import Plan
    from ..planning.predict import Box

BOX_H = 0.62          # box height, in lanes
FONT = 8
# zero-time tasks: (colour, marker, offset from the lane centre, legend); apply above the box, stash below
TICK = {"apply": ("black", "v", -(BOX_H / 2 + 0.09), "apply weights (no time)"),
        "stash": ("#666666", "^", BOX_H / 2 + 0.09, "stash delayed value (no time)")}


def box_labels(plan: "Plan", b: "Box") -> list[str]:
    """The texts for a run box, longest first; the drawing keeps the first that fits."""
    role = plan.graph.nodes[b.node].role
    if role == "generator":
        v = {(t, n): v for t, n, v in plan.staleness.generated}.get((b.step, b.node))
        if v is not None:
            return [f"gen b{b.step} v{v}", f"b{b.step} v{v}", f"b{b.step}"]
    if role == "trainer":
        tr = next((x for x in plan.staleness.trained if x.step == b.step), None)
        if tr is not None:
            return [f"upd b{tr.batch} v{tr.trainer_version}", f"b{tr.batch} v{tr.trainer_version}",
                    f"b{tr.batch}"]
    return [b.label, b.node, b.node[:3]]


def timeline_png(plan: "Plan", out: str, dpi: int = 110) -> None:
    """Draw the predicted schedule of ``plan`` to ``out`` (PNG)."""
    pred = plan.prediction
    if pred is None:
        pred = predict(plan)
    actors = list(plan.actors)
    lane = {a: i for i, a in enumerate(actors)}
    cmap = plt.get_cmap("tab10")
    colour = {n: cmap(i % 10) for i, n in enumerate(plan.graph.nodes)}
    runs = [b for b in pred.boxes if b.op == "run" and b.end > b.start]
    ticks = [b for b in pred.boxes if b.op == "stash"]
    span = max((b.end for b in pred.boxes), default=1.0) or 1.0
    shortest = min((b.end - b.start for b in runs), default=span)
    width = min(20.0, max(9.0, 0.8 * span / shortest + 1.5))
    fig, ax = plt.subplots(figsize=(width, 0.75 * len(actors) + 1.9))
    ax.set_xlim(0, span * 1.01)
    ax.set_ylim(len(actors) - 0.5, -0.5)
    ax.set_yticks(range(len(actors)), actors)
    ax.set_xlabel("seconds (predicted)")
    ax.grid(axis="x", color="#dddddd", lw=0.6)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)

    s = plan.graph.spec.schedule
    ax.set_title(f"{plan.name}: {mode_of(plan)}, predicted step {pred.step_s:.3g} s "
                 f"(serial {pred.serial_s:.3g} s), staleness bound {plan.bound}"
                 + (f", sync every {s.sync_every}" if s.sync_every > 1 else ""), fontsize=11)

    handles = [Patch(fc=colour[n], alpha=0.85, label=n) for n in plan.graph.nodes
               if any(b.node == n for b in runs)]
    if any(getattr(plan.graph.spec.nodes.get(b.node), "env", None) is not None for b in runs):
        handles.append(Patch(fc="#555555", label="model turns (at most max_turns)"))
    kinds = sorted({_tick_kind(b) for b in ticks})
    handles += [Line2D([], [], color=TICK[k][0], marker=TICK[k][1], ls="none", label=TICK[k][3]) for k in kinds]
    legend_rows = -(-len(handles) // 8)
    fig.tight_layout(rect=(0, (0.1 + 0.25 * legend_rows) / fig.get_figheight(), 1, 1))
    renderer = fig.canvas.get_renderer()
    nodes = plan.graph.spec.nodes
    for b in runs:
        y = lane[b.actor]
        ax.add_patch(Rectangle((b.start, y - BOX_H / 2), b.end - b.start, BOX_H,
                               fc=colour[b.node], ec="white", lw=1.0, alpha=0.85))
        _fit_text(ax, renderer, (b.start + b.end) / 2, y, b.end - b.start, box_labels(plan, b))
        env = getattr(nodes.get(b.node), "env", None)
        if env is not None:                 # multi-turn episodes: up to max_turns model turns, a strip each
            w = (b.end - b.start) / env.max_turns
            for t in range(env.max_turns):
                ax.add_patch(Rectangle((b.start + t * w, y + BOX_H / 2 + 0.03), w * 0.85, 0.08, fc="#555555", lw=0))
    for b in ticks:
        c, marker, dy, _ = TICK[_tick_kind(b)]
        ax.plot([b.start], [lane[b.actor] + dy], marker=marker, color=c, ms=6, ls="none", zorder=4)

    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), frameon=False,
               fontsize=9, bbox_to_anchor=(0.5, 0.0))
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def _tick_kind(b: "Box") -> str:
    return "apply" if b.label.startswith("apply") else "stash"


def _fit_text(ax, renderer, x: float, y: float, dur: float, texts: list[str]) -> None:
    """Write the first of ``texts`` that fits inside a box ``dur`` seconds wide; none if none fits."""
    x0, _ = ax.transData.transform((0, 0))
    x1, _ = ax.transData.transform((dur, 0))
    room = abs(x1 - x0) - 4
    for t in texts:
        txt = ax.text(x, y, t, ha="center", va="center", fontsize=FONT, color="white",
                      clip_on=True)
        if txt.get_window_extent(renderer).width <= room:
            return
        txt.remove()
