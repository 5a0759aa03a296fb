"""The graph as a PNG, drawn with matplotlib alone (no Graphviz binary needed).

Layout: a node's column is its longest path from a source along the edges
that point forward in the zero-delay topological order; nodes that share a
column stack vertically. Edges between neighbouring columns are straight;
the others run through the gutters between columns and round the boxes:
edges that point backwards (they close a cycle, so they carry a delay) below,
edges that skip columns above, so no arrow crosses a box. Boxes are coloured
by pool; delayed edges are dashed and labelled ``delay d``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch  # noqa: E402
from matplotlib.path import Path  # noqa: E402

from .text import edge_caption, mode_of, node_caption, pools_of  # noqa: E402

if TYPE_CHECKING:
    from ..planning import Plan

DY, H = 1.5, 0.8                   # row pitch and box height (inches; one data unit is one inch)
LANE = 0.45                        # vertical pitch of the routed (backward / skipping) edges
EDGE_FONT, NODE_FONT = 8, 10
CHAR_W = {EDGE_FONT: 0.065, NODE_FONT: 0.09}   # a generous average glyph width, inches
DATA, DELAYED = "#333333", "#8b1a1a"


def layout(plan: "Plan", dx: float) -> dict[str, tuple[float, float]]:
    """Node name -> box centre: columns ``dx`` apart, left to right, rows centred on y = 0."""
    g = plan.graph
    pos = {n: i for i, n in enumerate(g.topo)}
    col: dict[str, int] = {}
    for n in g.topo:
        col[n] = max((col[e.src] + 1 for e in g.inputs_of(n) if pos[e.src] < pos[n]), default=0)
    by_col: dict[int, list[str]] = {}
    for n in g.topo:
        by_col.setdefault(col[n], []).append(n)
    return {n: (c * dx, ((len(names) - 1) / 2 - r) * DY)
            for c, names in by_col.items() for r, n in enumerate(names)}


def _route(a: tuple[float, float], b: tuple[float, float], level: float, w: float, m: float) -> Path:
    """Out of ``a``'s right side, along the gutter to y = ``level``, across, into ``b``'s left side."""
    xa, xb = a[0] + w / 2, b[0] - w / 2
    verts = [(xa, a[1]), (xa + m, a[1]), (xa + m, level), (xb - m, level), (xb - m, b[1]), (xb, b[1])]
    return Path(verts, [Path.MOVETO] + [Path.LINETO] * 5)


def _label(ax, x: float, y: float, text: str, delayed: bool) -> None:
    ax.text(x, y, text, ha="center", va="center", fontsize=EDGE_FONT, zorder=5, linespacing=1.1,
            color=DELAYED if delayed else DATA,
            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))


def graph_png(plan: "Plan", out: str, dpi: int = 110) -> None:
    """Draw ``plan``'s graph to ``out`` (PNG): pools as colours, delays as dashed arrows."""
    g = plan.graph
    pos = {n: i for i, n in enumerate(g.topo)}
    chars = max(max(len(n.name), len(node_caption(n))) for n in g.nodes.values())
    w = max(1.7, CHAR_W[NODE_FONT] * chars + 0.5)
    label_chars = max(len(line) for e in g.edges for line in edge_caption(e, sep="\n").split("\n"))
    dx = w + max(1.0, CHAR_W[EDGE_FONT] * label_chars + 0.4)
    xy = layout(plan, dx)
    col = {n: round(x / dx) for n, (x, _) in xy.items()}
    pools = list(pools_of(plan))
    colour = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(pools)}

    # backward edges (they close a cycle) go round below the boxes, edges that skip columns above
    below = [e for e in g.edges if pos[e.src] >= pos[e.dst]]
    above = [e for e in g.edges if pos[e.src] < pos[e.dst] and col[e.dst] - col[e.src] > 1]
    straight = [e for e in g.edges if e not in below and e not in above]
    top = max(y for _, y in xy.values()) + H / 2
    bottom = min(y for _, y in xy.values()) - H / 2
    x_lo = -w / 2 - 0.5
    x_hi = max(x for x, _ in xy.values()) + w / 2 + 0.5
    y_hi, y_lo = top + LANE * (len(above) + 0.5), bottom - LANE * (len(below) + 0.5)
    fig_w, fig_h = max(x_hi - x_lo, 6.0), y_hi - y_lo
    pad = (fig_w - (x_hi - x_lo)) / 2
    fig = plt.figure(figsize=(fig_w, fig_h + 1.3))
    ax = fig.add_axes((0, 0.6 / (fig_h + 1.3), 1, fig_h / (fig_h + 1.3)))
    ax.set_xlim(x_lo - pad, x_hi + pad)
    ax.set_ylim(y_lo, y_hi)
    ax.axis("off")

    boxes = {}
    for n in g.nodes.values():
        x, y = xy[n.name]
        boxes[n.name] = FancyBboxPatch((x - w / 2, y - H / 2), w, H, boxstyle="round,pad=0,rounding_size=0.12",
                                       fc=(*colour[n.pool][:3], 0.3), ec=colour[n.pool], lw=1.8, zorder=3)
        ax.add_patch(boxes[n.name])
        ax.text(x, y + 0.13, n.name, ha="center", va="center", fontsize=NODE_FONT, weight="bold", zorder=4)
        ax.text(x, y - 0.16, node_caption(n), ha="center", va="center", fontsize=NODE_FONT - 1,
                color="#444444", style="italic", zorder=4)

    style = dict(arrowstyle="-|>", mutation_scale=14, lw=1.4, zorder=2)
    seen: dict[tuple[str, str], int] = {}
    for e in straight:
        k = seen[(e.src, e.dst)] = seen.get((e.src, e.dst), -1) + 1
        rad = 0.0 if k == 0 else 0.3 * ((k + 1) // 2) * (1 if k % 2 else -1)   # parallel edges fan out
        (x0, y0), (x1, y1) = xy[e.src], xy[e.dst]
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), patchA=boxes[e.src], patchB=boxes[e.dst],
                                     connectionstyle=f"arc3,rad={rad}", ls="--" if e.delay else "-",
                                     color=DELAYED if e.delay else DATA, **style))
        text = edge_caption(e, sep="\n")
        lift = 0.12 + 0.08 * text.count("\n") if y0 == y1 and rad == 0 else 0.0
        _label(ax, (x0 + x1) / 2 + rad / 2 * (y1 - y0), (y0 + y1) / 2 - rad / 2 * (x1 - x0) + lift,
               text, bool(e.delay))
    for i, e in enumerate(above + below):
        level = top + LANE * (i + 0.6) if i < len(above) else bottom - LANE * (i - len(above) + 0.6)
        (a, b), m = (xy[e.src], xy[e.dst]), min(0.2 + 0.1 * i, (dx - w) / 2 - 0.05)
        ax.add_patch(FancyArrowPatch(path=_route(a, b, level, w, m), ls="--" if e.delay else "-",
                                     color=DELAYED if e.delay else DATA, **style))
        _label(ax, (a[0] + b[0]) / 2, level, edge_caption(e), bool(e.delay))

    fig.suptitle(f"{plan.name}: mode {mode_of(plan)}, staleness bound: {plan.bound}", fontsize=12,
                 y=1 - 0.15 / (fig_h + 1.3), va="top")
    handles = [Patch(fc=(*colour[p][:3], 0.3), ec=colour[p], label=f"pool {p}") for p in pools]
    handles += [Line2D([], [], color=DATA, lw=1.4, label="edge (delay 0)"),
                Line2D([], [], color=DELAYED, lw=1.4, ls="--", label="delayed edge")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=9)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
