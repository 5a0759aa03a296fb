"""Pictures of a compiled plan: the graph as text or PNG, and the pipeline timeline.

Every renderer is a pure function of the plan, so a picture never disagrees
with what runs. Text formats come back as a string (and are written to
``out`` when given); PNGs are written to ``out``:

>>> import omnigraph as og
>>> from omnigraph.testing import canonical_spec
>>> plan = og.compile(canonical_spec("one_step_off"))
>>> print(render(plan, "ascii"), end="")
graph canonical-one_step_off (mode one_step_off)
<BLANKLINE>
pool rollout (1 actor, cpus 1, gpus 0)
  [generate]     generate
  [reward]       reward
pool trainer (1 actor, cpus 1, gpus 0)
  [old_logprob]  old_logprob
  [update]       update
  [sync]         sync
<BLANKLINE>
edges
  generate --> reward                Rollout
  reward ==[delay 1]==> old_logprob  Batch
  old_logprob --> update             Batch
  update --> sync                    Weights
  sync ==[delay 1]==> generate       Weights
<BLANKLINE>
staleness bound: 1 (max_staleness 1000; reward -> old_logprob delay 1; sync -> generate delay 1)
>>> render(plan, "mermaid").splitlines()[3]
'        generate["generate<br/>generate"]'
>>> render(plan, "png", out="graph.png")      # doctest: +SKIP
>>> timeline(plan, "timeline.png")            # doctest: +SKIP

``omnigraph viz GRAPH.yaml -f FORMAT [-o FILE] [--timeline]`` calls these.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GraphError
from .text import to_ascii, to_dot, to_mermaid

if TYPE_CHECKING:
    from ..planning import Plan

TEXT = {"mermaid": to_mermaid, "dot": to_dot, "ascii": to_ascii}
FORMATS = (*TEXT, "png")

__all__ = ["FORMATS", "render", "timeline", "to_ascii", "to_dot", "to_mermaid"]


def render(plan: "Plan", fmt: str, out: str | None = None) -> str | None:
    """The graph of ``plan`` in ``fmt`` (one of :data:`FORMATS`).

    A text format returns the text and also writes it to ``out`` when given;
    ``png`` needs ``out``, writes the image there and returns None.
    """
    if fmt in TEXT:
        text = TEXT[fmt](plan)
        if out is not None:
            Path(out).write_text(text)
        return text
    if fmt == "png":
        if out is None:
            raise GraphError("the png format needs a file to write", where="viz",
                             fix="pass out='graph.png' (-o graph.png on the command line)")
        from .png import graph_png      # matplotlib loads only when a picture is asked for
        graph_png(plan, out)
        return None
    raise GraphError(f"unknown format {fmt!r}", where="viz", fix=f"use one of {', '.join(FORMATS)}")


def timeline(plan: "Plan", out: str) -> None:
    """Write the predicted pipeline of ``plan`` (one lane per actor) as a PNG Gantt chart to ``out``."""
    from .gantt import timeline_png     # matplotlib loads only when a picture is asked for
    timeline_png(plan, out)
