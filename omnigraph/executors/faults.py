"""Fault injection for tests and ``bench/faults.py``: ``OMNIGRAPH_INJECT``.

``NODE[#RANK]@STEP[/POINT[.N]]:ACTION``, several separated by commas:

- ``update@5:raise``: the node raises as it starts at step 5;
- ``update#1@7:raise``: only on rank 1 of the node's pool;
- ``update@5/after_backward:exit``: inside the work, at the point the node
  marks with ``ctx.fault("after_backward")`` (``token`` in generation's token
  loop, ``after_backward`` between the backward pass and the optimizer step,
  ``export`` in the middle of a weight export, ``engine`` inside vLLM's
  engine); ``.N`` fires on the N-th time the point is reached that step;
- actions: ``raise`` (an exception), ``hang`` (never returns), ``exit`` (the
  process dies at once, like ``kill -9``), ``corrupt`` (the point's code damages
  what it works on, and must notice: ``generate@5/delta:corrupt`` changes one of
  the rollout's weights before a delta sync is applied to them).

Faults fire in a run's first attempt only (``OMNIGRAPH_ATTEMPT`` is 0), so a
supervised restart gets past them.

>>> parse("update@5:raise, generate#1@3/token.4:exit")
{('update', None, 5, None, 1): 'raise', ('generate', 1, 3, 'token', 4): 'exit'}
"""

from __future__ import annotations

import os
import re
import time

_ITEM = re.compile(r"^(?P<node>[\w\-]+)(?:#(?P<rank>\d+))?@(?P<step>-?\d+)(?:/(?P<point>\w+)(?:\.(?P<n>\d+))?)?"
                   r"(?::(?P<action>raise|hang|exit|corrupt))?$")


def parse(text: str) -> dict[tuple, str]:
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        m = _ITEM.match(item)
        if not m:
            raise ValueError(f"OMNIGRAPH_INJECT item {item!r} is not "
                             "NODE[#RANK]@STEP[/POINT[.N]][:raise|hang|exit|corrupt]")
        rank = int(m["rank"]) if m["rank"] is not None else None
        out[(m["node"], rank, int(m["step"]), m["point"], int(m["n"] or 1))] = m["action"] or "raise"
    return out


def inject(action: str, where: str) -> None:
    if action == "hang":
        while True:
            time.sleep(3600)
    if action == "exit":
        os._exit(137)
    raise RuntimeError(f"injected fault in {where}")


class Faults:
    """The faults planned for one actor, and where its nodes are now."""

    def __init__(self, rank: int):
        first = os.environ.get("OMNIGRAPH_ATTEMPT", "0") == "0"
        self.plan = parse(os.environ.get("OMNIGRAPH_INJECT", "")) if first else {}
        self.rank = rank
        self.step = -1
        self.counts: dict[tuple, int] = {}

    def at(self, node: str, step: int, point: str | None = None) -> bool:
        """Fire the fault planned for ``node`` at ``step`` (and ``point``), if any; True when it is ``corrupt``
        (the caller does the damage)."""
        if not self.plan:
            return False
        if point is None:
            self.step, self.counts = step, {}
        n = self.counts[(node, point)] = self.counts.get((node, point), 0) + 1
        for rank in (None, self.rank):
            action = self.plan.get((node, rank, step, point, n))
            if action == "corrupt":
                return True
            if action:
                inject(action, f"{node} at step {step}" + (f" ({point} #{n})" if point else ""))
        return False

    def hook(self, node: str):
        """``ctx.faults`` of ``node``: a point inside its work, at the step it is running."""
        return lambda point: self.at(node, self.step, point)
