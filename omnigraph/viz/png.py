"""The graph as a PNG, drawn with matplotlib alone (no Graphviz binary needed).

Layout: a node's column is its longest path from a source along the edges
that point forward in the zero-delay topological order; nodes that share a
column stack vertically. Edges that point backwards (they close a cycle, so
they carry a delay) are routed below the boxes, edges that skip columns above
them, so no arrow crosses a box. Boxes are coloured by pool; delayed edges
are dashed and labelled ``delay d``.
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
    from ..plan import Plan

DX, DY, H = 2.7, 1.5, 0.8          # column pitch, row pitch, box height (inches)
LANE = 0.45                        # vertical pitch of the routed (back / skipping) edges
EDGE_FONT, NODE_FONT = 8, 10


def layout(plan: "Plan") -> dict[str, tuple[float, float]]:
    """Node name -> box centre, columns left to right, rows centred on y = 0."""
    g = plan.graph
    pos = {n: i for i, n in enumerate(g.topo)}
    col: dict[str, int] = {}
    for n in g.topo:
        preds = [col[e.src] + 1 for e in g.inputs_of(n) if pos[e.src] < pos[n]]
        col[n] = max(preds, default=0)
    by_col: dict[int, list[str]] = {}
    for n in g.topo:
        by_col.setdefault(col[n], []).append(n)
    xy = {}
    for c, names in by_col.items():
        for r, n in enumerate(names):
            xy[n] = (c * DX, ((len(names) - 1) / 2 - r) * DY)
    return xy


def _route(a: tuple[float, float], b: tuple[float, float], level: float, w: float, self_loop: bool) -> Path:
    """A path that leaves box ``a`` vertically, runs along y = ``level`` and enters box ``b``."""
    side = 1 if level > a[1] else -1
    ax_, bx = (a[0] - w / 4, b[0] + w / 4) if self_loop else (a[0], b[0])
    verts = [(ax_, a[1] + side * H / 2), (ax_, level), (bx, level), (bx, b[1] + side * H / 2)]
    return Path(verts, [Path.MOVETO] + [Path.LINETO] * 3)


def _label(ax, x: float, y: float, text: str, delayed: bool) -> None:
    ax.text(x, y, text, ha="center", va="center", fontsize=EDGE_FONT, zorder=5,
            color="#8b1a1a" if delayed else "#333333",
            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))


def graph_png(plan: "Plan", out: str, dpi: int = 110) -> None:
    """Draw ``plan``'s graph to ``out`` (PNG): pools as colours, delays as dashed arrows."""
    g = plan.graph
    xy = layout(plan)
    pools = list(pools_of(plan))
    cmap = plt.get_cmap("tab10")
    colour = {p: cmap(i % 10) for i, p in enumerate(pools)}
    chars = max(max(len(n.name), len(node_caption(n))) for n in g.nodes.values())
    w = max(1.7, 0.09 * chars + 0.5)
    pos = {n: i for i, n in enumerate(g.topo)}
    col = {n: round(x / DX) for n, (x, _) in xy.items()}
    top = max(y for _, y in xy.values()) + H / 2
    bottom = min(y for _, y in xy.values()) - H / 2

    # edges: straight between neighbours, routed above (skipping) or below (backwards)
    routed_above, routed_below = [], []
    straight = []
    for e in g.edges:
        if pos[e.src] >= pos[e.dst]:
            routed_below.append(e)
        elif col[e.dst] - col[e.src] > 1 and abs(xy[e.src][1] - xy[e.dst][1]) < 1e-9:
            routed_above.append(e)
        else:
            straight.append(e)
    x_lo = min(x for x, _ in xy.values()) - w / 2 - 0.4
    x_hi = max(x for x, _ in xy.values()) + w / 2 + 0.4
    y_hi = top + LANE * (len(routed_above) + 0.4)
    y_lo = bottom - LANE * (len(routed_below) + 0.4)
    fig_w, fig_h = x_hi - x_lo, y_hi - y_lo
    fig = plt.figure(figsize=(max(fig_w, 6.0), fig_h + 1.3))
    ax = fig.add_axes((0, 0.6 / (fig_h + 1.3), 1, fig_h / (fig_h + 1.3)))
    ax.set_xlim(x_lo - (max(fig_w, 6.0) - fig_w) / 2, x_hi + (max(fig_w, 6.0) - fig_w) / 2)
    ax.set_ylim(y_lo, y_hi)
    ax.axis("off")

    boxes = {}
    for n in g.nodes.values():
        x, y = xy[n.name]
        box = FancyBboxPatch((x - w / 2, y - H / 2), w, H, boxstyle="round,pad=0,rounding_size=0.12",
                             fc=(*colour[n.pool][:3], 0.3), ec=colour[n.pool], lw=1.8, zorder=3)
        ax.add_patch(box)
        boxes[n.name] = box
        ax.text(x, y + 0.13, n.name, ha="center", va="center", fontsize=NODE_FONT, weight="bold", zorder=4)
        ax.text(x, y - 0.16, node_caption(n), ha="center", va="center", fontsize=NODE_FONT - 1,
                color="#444444", style="italic", zorder=4)

    style = dict(arrowstyle="-|>", mutation_scale=14, lw=1.4, zorder=2)
    pair_count: dict[tuple[str, str], int] = {}
    for e in straight:
        k = pair_count[(e.src, e.dst)] = pair_count.get((e.src, e.dst), -1) + 1
        rad = 0.0 if k == 0 else 0.25 * ((k + 1) // 2) * (1 if k % 2 else -1)
        (x0, y0), (x1, y1) = xy[e.src], xy[e.dst]
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), patchA=boxes[e.src], patchB=boxes[e.dst],
                                     connectionstyle=f"arc3,rad={rad}", ls="--" if e.delay else "-",
                                     color="#8b1a1a" if e.delay else "#333333", **style))
        _label(ax, (x0 + x1) / 2 - rad * (y1 - y0), (y0 + y1) / 2 + rad * (x1 - x0) + 0.22,
               edge_caption(e), bool(e.delay))
    for i, e in enumerate(routed_above):
        level = top + LANE * (i + 0.6)
        _routed(ax, xy, e, level, w, style)
    for i, e in enumerate(routed_below):
        level = bottom - LANE * (i + 0.6)
        _routed(ax, xy, e, level, w, style)

    mode = mode_of(plan)
    fig.suptitle(f"{plan.name}: mode {mode}, staleness bound: {plan.bound}", fontsize=12,
                 y=1 - 0.15 / (fig_h + 1.3), va="top")
    handles = [Patch(fc=(*colour[p][:3], 0.3), ec=colour[p], label=f"pool {p}") for p in pools]
    handles += [Line2D([], [], color="#333333", lw=1.4, label="edge (delay 0)"),
                Line2D([], [], color="#8b1a1a", lw=1.4, ls="--", label="delayed edge")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=9)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def _routed(ax, xy, e, level: float, w: float, style: dict) -> None:
    a, b = xy[e.src], xy[e.dst]
    colour = "#8b1a1a" if e.delay else "#333333"
    ax.add_patch(FancyArrowPatch(path=_route(a, b, level, w, e.src == e.dst),
                                 ls="--" if e.delay else "-", color=colour, **style))
    x_mid = (a[0] + b[0]) / 2
    _label(ax, x_mid, level, edge_caption(e), bool(e.delay))
