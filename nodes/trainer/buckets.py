"""Rows by completion length: the trainer's forward without most of its padding.

A batch's completions are padded to its longest one, and the forward runs over the
padding too: one sample that rambles to ``max_new_tokens`` while the rest stop early
multiplies the trainer's compute. :func:`length_buckets` splits a micro-batch's rows in
two (short and long) where the padding saved outweighs one more forward. Each bucket runs
as its own forward; the loss is still one token-mean over the whole micro-batch, so the
logprobs and the gradients are those of one forward, up to float rounding
(``tests/test_prefix.py``).

>>> import torch
>>> [b.tolist() for b in length_buckets(torch.tensor([3, 16, 4, 5, 3, 4, 3, 5]), overhead=4)]
[[0, 2, 3, 4, 5, 6, 7], [1]]
>>> length_buckets(torch.tensor([5, 6, 5, 6]), overhead=4) is None
True
"""

from __future__ import annotations

import torch

GAIN = 0.2
"""Split only when it saves at least this fraction of the padded tokens."""


def length_buckets(lengths: torch.Tensor, overhead: int) -> list[torch.Tensor] | None:
    """Two sets of row indices (short rows first), or ``None`` when one forward is as good.

    ``lengths``: each row's completion tokens; ``overhead``: what one more forward costs, in tokens (its
    fixed cost and the prompts it runs again). The split is the one of least ``rows x longest`` tokens over
    the two buckets, each row in the bucket its length sorts it into."""
    n = len(lengths)
    if n < 2:
        return None
    ordered, order = torch.sort(lengths.cpu(), stable=True)
    longest = int(ordered[-1])
    whole = n * longest
    k = torch.arange(1, n)                               # the first k sorted rows form the short bucket
    cost = k * ordered[:-1] + (n - k) * longest + overhead
    best = int(torch.argmin(cost))
    if cost[best] > (1 - GAIN) * whole:
        return None
    cut = best + 1
    order = order.to(lengths.device)
    return [order[:cut].sort().values, order[cut:].sort().values]
