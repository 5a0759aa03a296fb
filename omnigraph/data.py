"""The values that flow along edges: sample batches and weight snapshots.

A :class:`SampleBatch` is a block of prompt groups generated in one step. Each
sample carries the version span of the weights that generated it
(``min_version``, ``max_version``: they differ only when generation spanned a
weight change). Per-sample fields (token ids, rewards, logprobs) are lists or
tensors whose first dimension is the sample.

>>> b = SampleBatch(batch_id=3, group_ids=[30, 30, 31, 31], min_version=[2, 2, 2, 2],
...                 max_version=[2, 2, 2, 2], fields={"reward": [1.0, 0.0, 0.5, 0.5]})
>>> b.shard(1, 2).group_ids
[31, 31]
>>> SampleBatch.concat([b.shard(0, 2), b.shard(1, 2)]).fields["reward"]
[1.0, 0.0, 0.5, 0.5]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence


def _take(values: Any, idx: list[int]) -> Any:
    if isinstance(values, list):
        return [values[i] for i in idx]
    return values[idx]          # torch / numpy fancy indexing


def _cat(parts: list[Any]) -> Any:
    if isinstance(parts[0], list):
        return [x for p in parts for x in p]
    import torch
    if isinstance(parts[0], torch.Tensor):
        width = max(p.shape[1] for p in parts) if parts[0].dim() > 1 else None
        if width is not None:   # right-pad sequences to a common length
            parts = [torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts]
        return torch.cat(parts)
    raise TypeError(f"cannot concatenate fields of type {type(parts[0]).__name__}")


@dataclass
class SampleBatch:
    batch_id: int
    group_ids: list[int]
    min_version: list[int]
    max_version: list[int]
    fields: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    """Batch-level facts (e.g. ``pad_token_id``); kept from the first part on concat."""

    def __len__(self) -> int:
        return len(self.group_ids)

    @property
    def groups(self) -> list[int]:
        return list(dict.fromkeys(self.group_ids))

    def select(self, idx: Sequence[int]) -> "SampleBatch":
        idx = list(idx)
        return SampleBatch(self.batch_id, _take(self.group_ids, idx), _take(self.min_version, idx),
                           _take(self.max_version, idx), {k: _take(v, idx) for k, v in self.fields.items()},
                           dict(self.meta))

    def shard(self, rank: int, world: int) -> "SampleBatch":
        """Rank ``rank``'s share: whole prompt groups, split evenly and in order."""
        if world == 1:
            return self
        groups = self.groups
        per = len(groups) // world
        if per * world != len(groups):
            # groups do not divide evenly (validation checks samples divide): split samples instead
            n = len(self) // world
            return self.select(range(rank * n, (rank + 1) * n))
        mine = set(groups[rank * per:(rank + 1) * per])
        return self.select([i for i, g in enumerate(self.group_ids) if g in mine])

    def with_fields(self, **fields: Any) -> "SampleBatch":
        return replace(self, fields={**self.fields, **fields})

    @staticmethod
    def concat(parts: list["SampleBatch"]) -> "SampleBatch":
        if len(parts) == 1:
            return parts[0]
        keys = parts[0].fields.keys()
        return SampleBatch(
            batch_id=parts[0].batch_id,
            group_ids=[g for p in parts for g in p.group_ids],
            min_version=[v for p in parts for v in p.min_version],
            max_version=[v for p in parts for v in p.max_version],
            fields={k: _cat([p.fields[k] for p in parts]) for k in keys},
            meta=dict(parts[0].meta))


@dataclass
class Weights:
    """A policy snapshot. ``tensors`` is ``None`` for synthetic nodes (only the version travels)."""

    version: int
    tensors: dict[str, Any] | None = None
    payload: str = "full"
    nbytes: int = 0

    def __repr__(self) -> str:
        n = len(self.tensors) if self.tensors else 0
        return f"Weights(version={self.version}, payload={self.payload!r}, tensors={n}, nbytes={self.nbytes})"
