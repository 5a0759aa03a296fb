"""The guard against silent corruption: a NaN or inf in what a step trains on, or in weights a rollout receives,
is never used.

A NaN in one reward, one log-prob or one gradient spreads to every weight in one optimizer step, and from
there to every sample after: a run that trains on it is silently ruined. So the nodes check what they are
handed and skip the work rather than use it:

- ``reward`` (:mod:`nodes.rewards.scorer`): a reward function's NaN or inf is counted (``nonfinite_rewards``)
  and left in place; its group's advantages come out non-finite, and the update skips the step;
- ``update`` (:mod:`nodes.trainer.update`): the batch's ``advantage``, ``logprob``, ``old_logprob`` and
  ``ref_logprob`` before the step, the gradients after the backward pass (before the optimizer step): the
  step's update is skipped (the optimizer's step not taken, the gradients zeroed);
- ``generate`` (:mod:`nodes.rollout.base`): the weights received at a sync are not loaded; the rollout keeps
  the weights it holds.

Each skip prints one line naming the node, the step and the tensor (``update: step 7: 3 non-finite values in
advantage; the update is skipped``) and is counted in the step's metrics (:class:`Streak`). The runtime stops
the run after ``runtime.max_nonfinite_steps`` such steps in a row (:mod:`omnigraph.runtime.supervisor`).

Tests and benchmarks fire the guard with ``OMNIGRAPH_INJECT``'s ``corrupt`` action at the points these nodes
mark (``ctx.fault(point)`` is True there): ``reward@S/rewards:corrupt``, ``update@S/advantage:corrupt``,
``update@S/logprob:corrupt``, ``update@S/old_logprob:corrupt``, ``update@S/after_backward:corrupt``,
``generate@S/weights:corrupt`` (:func:`poison` does the damage).

>>> s = Streak()
>>> s.record(True)
{'nonfinite_skipped': 1, 'nonfinite_skipped_total': 1, 'nonfinite_in_a_row': 1}
>>> s.record(True)["nonfinite_in_a_row"], s.record(False)
(2, {'nonfinite_skipped': 0, 'nonfinite_skipped_total': 2, 'nonfinite_in_a_row': 0})
>>> count([1.0, float("nan"), float("-inf")])
2
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass
class Streak:
    """Skipped steps of one node: this step's, the run's total, and how many in a row (kept in the node's
    checkpointed state, so a resumed run goes on counting). ``prefix`` names the metrics."""

    prefix: str = "nonfinite"
    total: int = 0
    in_a_row: int = 0

    def record(self, skipped: bool) -> dict[str, int]:
        """Count one step (skipped or not); the metrics to log for it."""
        self.total += int(skipped)
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        p = self.prefix
        return {f"{p}_skipped": int(skipped), f"{p}_skipped_total": self.total, f"{p}_in_a_row": self.in_a_row}

    def state_dict(self) -> dict[str, int]:
        return {"total": self.total, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict | None) -> None:
        """``None``: a checkpoint from before the guard (nothing skipped)."""
        state = state or {}
        self.total, self.in_a_row = int(state.get("total", 0)), int(state.get("in_a_row", 0))


def warn(node: str, when: str, found: dict[str, int], then: str) -> None:
    """The one line a skip prints: ``update: step 7: 3 non-finite values in advantage; the update is skipped``
    (``found``: tensor -> count; empty: found by another rank of the node's pool)."""
    what = ", ".join(f"{n} in {name}" if i else f"{n} non-finite values in {name}"
                     for i, (name, n) in enumerate(found.items())) or "non-finite values on another rank"
    print(f"{node}: {when}: {what}; {then}", file=sys.stderr, flush=True)


def count(values: Iterable[float]) -> int:
    """Non-finite numbers in a list of floats."""
    return sum(not math.isfinite(v) for v in values)


def count_tensor(t: Any) -> int:
    """Non-finite values in one tensor (this rank's shard of a distributed one); 0 for integer tensors."""
    import torch
    t = t.to_local() if hasattr(t, "to_local") else t
    if not torch.is_floating_point(t):
        return 0
    return int((~torch.isfinite(t)).sum())


def finite_tensors(tensors: Iterable[Any]) -> bool:
    """Whether every floating tensor is finite. One read of each (``torch.isfinite(t).all()``, a temporary
    the size of the largest tensor) and one host sync per device at the end, not one per tensor."""
    import torch
    flags: dict[Any, list] = {}
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        if torch.is_floating_point(t) and t.numel():
            flags.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(f).all()) for f in flags.values())


def poison(t: Any) -> Any:
    """A test's ``corrupt``: a copy of ``t`` with its first value NaN (the original is never touched: it may be
    another node's tensor); ``t`` itself when it holds nothing to damage."""
    import torch
    if not torch.is_tensor(t) or not torch.is_floating_point(t) or not t.numel():
        return t
    out = t.detach().clone()
    out.view(-1)[0] = float("nan")
    return out
