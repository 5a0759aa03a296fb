"""The values that cross edges: prompts, sample batches and weight snapshots.

A :class:`Prompt` is one item of a task: its text, what the reward needs to
know (``meta``, e.g. the target answer) and the prompt group it starts (the
engine numbers groups ``step * prompts + i`` and hands the generator its
share).

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

Token fields that begin with the prompt (``input_ids``, ``attention_mask``)
are *prompt-aligned*: the prompt is left-padded to ``meta["prompt_len"]``.
A generator lists them in ``meta["prompt_aligned"]`` with their pad values,
and :meth:`SampleBatch.concat` left-pads them to the widest prompt of the
parts (and right-pads the completions), so shards generated on different
ranks join into one batch.

Two branches of one batch (e.g. ``old_logprob`` and ``ref_logprob`` on
different pools) come back together with :meth:`SampleBatch.join`: same batch,
same samples, their fields merged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Prompt:
    text: str
    meta: dict[str, Any] = field(default_factory=dict)
    """What the reward needs besides the completion (e.g. ``target``)."""
    group: int = -1
    """The prompt group this prompt starts (set by the engine)."""
    chat: bool = False
    """Wrap ``text`` in the model's chat template (as the user's message, after ``system``)."""
    system: str | None = None
    messages: list[dict[str, Any]] | None = None
    """A whole conversation (``[{"role": ..., "content": ...}, ...]``) to render with the chat template instead
    of ``system`` + ``text`` (``text`` is then the last user message, for the reward)."""
    images: tuple[bytes, ...] = ()
    """Pictures the prompt shows, as encoded files (PNG, JPEG, ...), in order: one ``<image>`` in ``text`` for
    each, or one ``{"type": "image"}`` part in the messages' content (an image-text model's rollout expands
    it into the picture's image tokens)."""


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


def _align_prompts(parts: list["SampleBatch"]) -> list["SampleBatch"]:
    """Left-pad every part's prompt-aligned fields to the widest ``prompt_len`` among the parts."""
    widths = [p.meta.get("prompt_len") for p in parts]
    if None in widths or len(set(widths)) == 1:
        return parts
    import torch
    wide = max(widths)
    out = []
    for p in parts:
        extra = wide - p.meta["prompt_len"]
        if extra:
            pads = p.meta.get("prompt_aligned", {})
            fields = {k: torch.nn.functional.pad(v, (extra, 0), value=pads[k]) if k in pads else v
                      for k, v in p.fields.items()}
            p = replace(p, fields=fields, meta={**p.meta, "prompt_len": wide})
        out.append(p)
    return out


@dataclass
class SampleBatch:
    batch_id: int
    group_ids: list[int]
    min_version: list[int]
    max_version: list[int]
    fields: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    """Batch-level facts (e.g. ``prompt_len``); kept from the first part on concat."""

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
        parts = _align_prompts(parts)
        keys = parts[0].fields.keys()
        return SampleBatch(
            batch_id=parts[0].batch_id,
            group_ids=[g for p in parts for g in p.group_ids],
            min_version=[v for p in parts for v in p.min_version],
            max_version=[v for p in parts for v in p.max_version],
            fields={k: _cat([p.fields[k] for p in parts]) for k in keys},
            meta=dict(parts[0].meta))

    @staticmethod
    def join(parts: list["SampleBatch"]) -> "SampleBatch":
        """Branches of the same batch, their fields merged (the first branch's value of a field wins).

        The branches must hold the same batch and the same samples in the same order; the versions are
        the oldest and newest of the parts (a join is as stale as its stalest branch)."""
        first = parts[0]
        for p in parts[1:]:
            if p.batch_id != first.batch_id or list(p.group_ids) != list(first.group_ids):
                raise ValueError(f"cannot join batch {p.batch_id} ({len(p)} samples) with batch {first.batch_id} "
                                 f"({len(first)} samples): a join needs the same samples on every branch")
        fields: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        for p in parts:
            for k, v in p.fields.items():
                fields.setdefault(k, v)
            for k, v in p.meta.items():
                meta.setdefault(k, v)
        lo = [min(vs) for vs in zip(*(p.min_version for p in parts))]
        hi = [max(vs) for vs in zip(*(p.max_version for p in parts))]
        return SampleBatch(first.batch_id, list(first.group_ids), lo, hi, fields, meta)


@dataclass
class Weights:
    """A policy snapshot on its way from the trainer to the rollouts.

    ``tensors`` is what a receiver loads (a mapping ``name -> tensor``); ``None`` when there is nothing
    to load: a version-only policy (synthetic nodes), or weights the transport has already written into
    the receiver's own tensors (``loaded``)."""

    version: int
    tensors: Mapping[str, Any] | None = None
    payload: str = "full"
    """``full`` weights or ``lora`` adapter tensors."""
    nbytes: int = 0
    path: str = ""
    """The transport that carried them (``shm``, ``nccl``, ...; see ``plan.txt``)."""
    loaded: bool = False
    arrive_s: float = 0.0
    """Seconds the transport took on the receiver to write ``loaded`` weights into its tensors (``cuda-ipc``)."""

    def __repr__(self) -> str:
        n = len(self.tensors) if self.tensors is not None else 0
        return (f"Weights(version={self.version}, payload={self.payload!r}, tensors={n}, nbytes={self.nbytes}"
                + (f", path={self.path!r}" if self.path else "") + (", loaded" if self.loaded else "") + ")")
