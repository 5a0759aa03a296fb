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
  the rollout's weights before a delta sync is applied to them);
- ``kill``, at one of the driver's points (:data:`DRIVER_POINTS`), for tests of the
  Ray executors: the driver itself SIGKILLs the process of the actor that runs the
  node (its rank 0 unless ``#RANK``) when its loop reaches that point of the step:
  ``update@5/submit:kill`` once the actor is seen dead, just before step 5 is
  submitted (:class:`DriverFaults`).

Faults fire in a run's first attempt only (``OMNIGRAPH_ATTEMPT`` is 0), so a
supervised restart gets past them. With ``OMNIGRAPH_INJECT_ONCE=FILE`` instead, each
fault fires once over every attempt and every process that reads the file (a
requeued job's too): the first to reach it appends it to ``FILE`` before it fires,
and the others pass it. A long run can so meet many faults in turn, each one in the
attempt that first gets to it (``bench/soak.py``).

>>> parse("update@5:raise, generate#1@3/token.4:exit")
{('update', None, 5, None, 1): 'raise', ('generate', 1, 3, 'token', 4): 'exit'}
"""

from __future__ import annotations

import os
import re
import time

_ITEM = re.compile(r"^(?P<node>[\w\-]+)(?:#(?P<rank>\d+))?@(?P<step>-?\d+)(?:/(?P<point>\w+)(?:\.(?P<n>\d+))?)?"
                   r"(?::(?P<action>raise|hang|exit|corrupt|kill))?$")

DRIVER_POINTS = {
    "submit": "before the step is submitted, once the killed actor is seen dead (and a compiled graph torn down)",
    "submitting": "as the step is submitted: the signal goes out and the driver submits at once, without waiting",
    "submitted": "right after the step was submitted, once the killed actor is seen dead",
    "collect": "once the step's results are ready, before the driver reads them",
    "snapshot": "while a checkpoint's snapshot calls are out (STEP: the step the checkpoint comes after)",
}
"""Where in the Ray driver's loop a ``kill`` can land (``NODE@STEP/POINT:kill``)."""


def parse(text: str) -> dict[tuple, str]:
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        m = _ITEM.match(item)
        if not m:
            raise ValueError(f"OMNIGRAPH_INJECT item {item!r} is not "
                             "NODE[#RANK]@STEP[/POINT[.N]][:raise|hang|exit|corrupt]")
        rank = int(m["rank"]) if m["rank"] is not None else None
        action = m["action"] or "raise"
        if (action == "kill") != (m["point"] in DRIVER_POINTS):
            raise ValueError(f"OMNIGRAPH_INJECT item {item!r}: kill goes with a driver point and a driver point with "
                             f"kill ({', '.join(DRIVER_POINTS)})")
        out[(m["node"], rank, int(m["step"]), m["point"], int(m["n"] or 1))] = action
    return out


def planned(keep) -> dict[tuple, str]:
    """The items of ``OMNIGRAPH_INJECT`` that may still fire here, those ``keep(action)`` accepts: in a first
    attempt all of them; with ``OMNIGRAPH_INJECT_ONCE``, in any attempt, those no process has fired yet."""
    once = os.environ.get("OMNIGRAPH_INJECT_ONCE")
    if not once and os.environ.get("OMNIGRAPH_ATTEMPT", "0") != "0":
        return {}
    fired = set(fired_items(once)) if once else set()
    return {k: v for k, v in parse(os.environ.get("OMNIGRAPH_INJECT", "")).items()
            if keep(v) and item_name(k, v) not in fired}


def item_name(key: tuple, action: str) -> str:
    """The item's canonical text: ``update#0@5/submit.1:kill`` (no rank: ``*``)."""
    node, rank, step, point, n = key
    return f"{node}#{'*' if rank is None else rank}@{step}/{point or ''}.{n}:{action}"


def fired_items(path: str) -> list[str]:
    """The items fired so far, as the once-file lists them (none when it does not exist)."""
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def record_fired(key: tuple, action: str) -> None:
    """Append the item to the once-file (``OMNIGRAPH_INJECT_ONCE``), on disk before it fires: an ``exit`` or a
    ``kill`` leaves no time after."""
    once = os.environ.get("OMNIGRAPH_INJECT_ONCE")
    if not once:
        return
    with open(once, "a") as f:
        f.write(item_name(key, action) + "\n")
        f.flush()
        os.fsync(f.fileno())


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
        self.plan = planned(lambda action: action != "kill")      # kills are the driver's (DriverFaults)
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
            key = (node, rank, step, point, n)
            action = self.plan.pop(key, None)
            if action:
                record_fired(key, action)
            if action == "corrupt":
                return True
            if action:
                inject(action, f"{node} at step {step}" + (f" ({point} #{n})" if point else ""))
        return False

    def hook(self, node: str):
        """``ctx.faults`` of ``node``: a point inside its work, at the step it is running."""
        return lambda point: self.at(node, self.step, point)


class DriverFaults:
    """The ``kill`` items of ``OMNIGRAPH_INJECT``, for the driver of a Ray executor: which actor process to
    SIGKILL at a point of its loop. First attempt only, each once."""

    def __init__(self):
        self.plan = {(step, point): (node, rank, n)
                     for (node, rank, step, point, n) in planned(lambda action: action == "kill")}

    def due(self, step: int, point: str) -> tuple[str, int] | None:
        """``(node, rank)`` whose actor is to be killed now, or None (then never again for this point)."""
        found = self.plan.pop((step, point), None) if self.plan else None
        if found is None:
            return None
        node, rank, n = found
        record_fired((node, rank, step, point, n), "kill")
        return node, rank or 0
