"""What the engine checks on every value a node hands it, whatever the backend.

- :func:`rollout`: a generator's batch holds the prompt groups it was given (with partial rollouts:
  those and the ones it carried in, less the ones it still carries out: none lost, none twice), is stamped
  with versions no newer than its weights, and spans no more firings than the graph allows;
- :func:`token_staleness`: with per-token versions (``token_version``, ``[samples, tokens]``, ``-1`` where
  there is no token), every token's staleness at the trainer, and a sample's ``min_version`` must be its
  oldest token: a generator cannot make a sample look fresher than it is.

>>> from omnigraph.sdk import SampleBatch
>>> b = SampleBatch(4, [40, 40], [1, 2], [2, 2], {"token_version": [[1, 2, -1], [2, 2, 2]]})
>>> token_staleness(b, 3)
(2, 1.2)
"""

from __future__ import annotations

from typing import Any

from ..errors import StalenessError
from ..sdk import Prompt, SampleBatch, Weights


def rollout(node: str, batch: Any, prompts: list[Prompt], weights: Weights, *, carried_in: set[int] = frozenset(),
            carried_out: set[int] = frozenset(), spans: int = 1) -> None:
    if not isinstance(batch, SampleBatch):
        raise TypeError(f"generate() returned a {type(batch).__name__}, not a SampleBatch")
    want = {p.group for p in prompts} | set(carried_in)
    got = set(batch.group_ids)
    if spans == 1 and got != want:
        raise ValueError(f"the rollout's prompt groups {sorted(got)[:6]} are not the ones given {sorted(want)[:6]}")
    if spans > 1:
        if got & set(carried_out):
            raise ValueError(f"groups {sorted(got & set(carried_out))[:6]} are both returned and still in flight")
        if got | set(carried_out) != want:
            lost, extra = want - got - set(carried_out), (got | set(carried_out)) - want
            raise ValueError(f"partial rollouts lost groups {sorted(lost)[:6]} or invented {sorted(extra)[:6]}: "
                             "every group given must come back in a batch or stay in flight")
    if any(v > weights.version for v in batch.max_version):
        raise ValueError(f"samples stamped with versions {max(batch.max_version)} newer than the weights "
                         f"{weights.version} they were given")
    s = batch.fields.get("spans")
    if s is not None and len(s) and max(int(x) for x in s) > spans:
        raise ValueError(f"a sample spans {max(int(x) for x in s)} firings; the graph allows {spans} "
                         f"(partial.max_spans)")


def token_staleness(batch: SampleBatch, version: int) -> tuple[int, float] | None:
    """``(max, mean)`` staleness over every sampled token at trainer version ``version``; None without
    per-token versions. Raises :class:`StalenessError` when a sample's ``min_version`` is newer than one of
    its tokens."""
    tv = batch.fields.get("token_version")
    if tv is None or len(batch) == 0:
        return None
    rows = tv.tolist() if hasattr(tv, "tolist") else tv
    worst, total, count = 0, 0, 0
    for i, row in enumerate(rows):
        real = [int(x) for x in row if x >= 0]
        if not real:
            continue
        if min(real) < batch.min_version[i]:
            raise StalenessError(f"batch {batch.batch_id}: sample {i} (group {batch.group_ids[i]}) is stamped "
                                 f"min_version {batch.min_version[i]} but has a token sampled at version {min(real)}")
        worst = max(worst, version - min(real))
        total += sum(version - x for x in real)
        count += len(real)
    return worst, round(total / max(count, 1), 6)
