"""What an executor is: start actors for a plan, yield one result per step, stop.

Nothing outside ``omnigraph/executors/`` knows which executor runs; the
runtime only sees :class:`StepResult` objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass
class StepResult:
    step: int
    fired: frozenset[str]
    records: list[dict[str, Any]] = field(default_factory=list)
    """One record per node run: node, actor, seconds, t_start/t_end and the node's metrics."""


class Executor:
    name = "base"

    def __init__(self, plan, **options: Any):
        self.plan = plan
        self.options = options
        self.on_status = options.get("on_status") or (lambda text: None)
        """Called with a line of text while slow work (actors starting, engines loading) goes on."""

    def start(self) -> None:
        """Create the actors and build every node (models load here)."""

    def steps(self, start: int = 0, barrier=None, stop=None) -> Iterator[StepResult]:
        """Yield each step's result from ``start`` on; nothing is in flight past a step ``t`` for
        which ``barrier(t + 1)`` holds when it is yielded. Once ``stop()`` is true, no new step is
        submitted: those in flight are yielded and the iteration ends (a quiet point)."""
        raise NotImplementedError

    def snapshot(self) -> dict[str, bytes]:
        """Every actor's state (delay buffers, versions, node state), between steps."""
        raise NotImplementedError

    def restore(self, snaps: dict[str, bytes]) -> None:
        raise NotImplementedError

    def finish(self, run_dir: str) -> None:
        """After the last step: let the nodes save what they keep (final weights)."""

    def stop(self) -> None:
        """Tear everything down; must be safe to call twice and after a failure."""

    def __enter__(self) -> "Executor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
