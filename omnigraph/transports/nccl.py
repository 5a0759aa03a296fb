"""The ``nccl`` weights path: a torch.distributed group from the trainer to every rollout replica.

When ``sync`` and every consumer of its weights sit on whole GPUs of their
own (``pools.*.gpus >= 1``), the bytes do not travel through the graph's
channels at all (Ray 2.60's Compiled Graph NCCL channels assert on our
programs, and NCCL needs one GPU per rank). Instead:

- before the first step the executor forms one NCCL group per such ``sync``
  node (the plan lists them: ``Plan.groups``): rank 0 is the actor that runs
  ``sync``, ranks 1.. the consumer actors (:mod:`omnigraph.transports.groups`),
  with one warm-up broadcast so the communicator exists before the first
  sync (lazily, NCCL would block the sender until the receivers join);
- ``sync`` describes the tensors once (:func:`describe`: names, shapes, wire
  dtypes, the bucket layout) and :func:`send` broadcasts them bucket by
  bucket: each bucket is cast into one of two reusable buffers of
  ``transport_options.bucket_mb`` and broadcast, so the sender's extra memory is two
  buckets whatever the model's size. The host does not wait for the
  receivers: the broadcasts queue on the GPU;
- the :class:`NcclWeights` value that travels through the graph carries only
  that description (a few kB); on each rollout actor the interpreter calls
  :func:`receive` when the value arrives (the ``apply`` task: :meth:`Nccl.arrive`),
  in the order the sender sent, bucket by bucket straight into the model's
  parameters.

Tensors larger than a bucket are split over several buckets.

>>> import torch
>>> meta = describe({"a": torch.zeros(3, 4), "b": torch.zeros(10, dtype=torch.int64), "t": None}, "g",
...                 dtype=torch.bfloat16, bucket_bytes=256)
>>> [(e.name, e.dtype, e.shape) for e in meta.entries], meta.nbytes
([('a', 'bfloat16', (3, 4)), ('b', 'int64', (10,))], 104)
>>> [[(p.name, p.start, p.numel, p.offset) for p in b.pieces] for b in meta.buckets]
[[('a', 0, 12, 0)], [('b', 0, 10, 0)]]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from pydantic import Field

from ..sdk import Options, Weights, WeightsState
from .base import Transport
from . import weights_group
from .groups import Group, group, member

ALIGN = 256
"""Byte alignment of every piece in a bucket (any dtype can be viewed there)."""


# ---------------------------------------------------------------- the description

@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str                      # on the wire (and in the receiver's buffer)
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Piece:
    name: str
    start: int                      # first element of the tensor (flattened) in this piece
    numel: int
    offset: int                     # byte offset in the bucket


@dataclass(frozen=True)
class Bucket:
    nbytes: int
    pieces: tuple[Piece, ...]


@dataclass
class NcclWeights:
    """What travels through the graph when weights go by NCCL: names, shapes, dtypes, buckets; no bytes."""

    group: str
    entries: tuple[Entry, ...]
    buckets: tuple[Bucket, ...]
    aliases: dict[str, str] = field(default_factory=dict)
    """Tied weights: name -> the name whose bytes are sent (once)."""
    path: str = "nccl"
    pending = True                  # the bytes are still to be received (on arrival)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def bucket_bytes(self) -> int:
        return max((b.nbytes for b in self.buckets), default=0)

    def names(self) -> list[str]:
        return [e.name for e in self.entries] + list(self.aliases)

    def __len__(self) -> int:
        return len(self.entries) + len(self.aliases)

    def __repr__(self) -> str:
        return (f"NcclWeights({len(self)} tensors, {self.nbytes / 1e6:.1f} MB in {len(self.buckets)} buckets "
                f"of <= {self.bucket_bytes / 1e6:.1f} MB, group {self.group})")


def _itemsize(dtype: str) -> int:
    return torch.empty(0, dtype=getattr(torch, dtype)).element_size()


def layout(entries: list[Entry], bucket_bytes: int) -> tuple[Bucket, ...]:
    """Entries in order, packed into buckets of at most ``bucket_bytes``; a tensor that does not fit in
    the rest of a bucket continues in the next one. Pieces start at multiples of :data:`ALIGN`."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket of {bucket_bytes} bytes: at least {ALIGN}")
    buckets: list[Bucket] = []
    pieces: list[Piece] = []
    used = 0
    for e in entries:
        size = _itemsize(e.dtype)
        start, left = 0, e.numel
        while left:
            at = -(-used // ALIGN) * ALIGN
            room = (bucket_bytes - at) // size if at < bucket_bytes else 0
            if room == 0:
                buckets.append(Bucket(used, tuple(pieces)))
                pieces, used = [], 0
                continue
            n = min(left, room)
            pieces.append(Piece(e.name, start, n, at))
            used = at + n * size
            start, left = start + n, left - n
    if pieces:
        buckets.append(Bucket(used, tuple(pieces)))
    return tuple(buckets)


def describe(tensors: Mapping[str, Any], group: str, *, dtype=None, bucket_bytes: int = 256 << 20) -> NcclWeights:
    """The description of ``tensors`` (floating ones sent as ``dtype`` when given); tied tensors once."""
    entries: list[Entry] = []
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in tensors.items():
        if t is None:
            continue
        key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        if key in seen and t.numel():
            aliases[name] = seen[key]
            continue
        seen[key] = name
        wire = dtype if dtype is not None and t.is_floating_point() else t.dtype
        entries.append(Entry(name, str(wire).removeprefix("torch."), tuple(t.shape)))
    return NcclWeights(group, tuple(entries), layout(entries, bucket_bytes), aliases)


# ---------------------------------------------------------------- moving the bytes

def _views(buf, bucket: Bucket, sizes: dict[str, tuple[Any, int]]):
    for p in bucket.pieces:
        dt, size = sizes[p.name]
        yield p, buf[p.offset:p.offset + p.numel * size].view(dt)


def _dtypes(meta: NcclWeights) -> dict[str, tuple[Any, int]]:
    return {e.name: (getattr(torch, e.dtype), _itemsize(e.dtype)) for e in meta.entries}


def send(meta: NcclWeights, tensors: Mapping[str, Any], g: Group, fault=None) -> None:
    """Broadcast ``tensors`` as ``meta`` says, from rank 0. Returns once every bucket is queued on the GPU:
    the receivers take them when they get there (their ``apply``), and the next send reuses the buffers
    only after these broadcasts are done."""
    sizes = _dtypes(meta)
    flat = {e.name: tensors[e.name].detach().reshape(-1) for e in meta.entries}
    with torch.no_grad():
        for i, bucket in enumerate(meta.buckets):
            b = i % 2
            if b in g.inflight:
                g.inflight.pop(b).wait()    # the buffer's last broadcast is done (the stream waits, not the host)
            buf = g.buffer(b, meta.bucket_bytes)
            for p, view in _views(buf, bucket, sizes):
                view.copy_(flat[p.name][p.start:p.start + p.numel])
            g.inflight[b] = g.broadcast(buf[:bucket.nbytes])
            if fault is not None:
                fault("export")           # some buckets sent, the rest not


def receive(meta: NcclWeights, g: Group, targets: Mapping[str, Any]) -> None:
    """Receive the broadcast ``meta`` describes into ``targets`` (name -> contiguous tensor, e.g. the model's
    own parameters), bucket by bucket; returns when the bytes are in place."""
    want, have = set(meta.names()), set(targets)
    if want != have:
        raise RuntimeError(f"weights over NCCL do not match the model: missing here {sorted(want - have)[:5]}, "
                           f"not sent {sorted(have - want)[:5]}")
    sizes = _dtypes(meta)
    flat = {}
    for e in meta.entries:
        t = targets[e.name]
        if tuple(t.shape) != e.shape or not t.is_contiguous():
            raise RuntimeError(f"weights over NCCL: {e.name} is {tuple(t.shape)} here, {e.shape} sent "
                               "(or not contiguous)")
        flat[e.name] = t.view(-1)
    with torch.no_grad():
        for i, bucket in enumerate(meta.buckets):
            buf = g.buffer(i % 2, meta.bucket_bytes)
            g.broadcast(buf[:bucket.nbytes]).wait()
            for p, view in _views(buf, bucket, sizes):
                flat[p.name][p.start:p.start + p.numel].copy_(view)
        for alias, name in meta.aliases.items():
            if targets[alias].data_ptr() != targets[name].data_ptr():
                targets[alias].copy_(targets[name])
    if g.device.type == "cuda":
        torch.cuda.current_stream(g.device).synchronize()


def fetch(meta: NcclWeights, g: Group | None = None) -> dict[str, Any]:
    """Receive into fresh tensors (for consumers that load weights later, or a delay line deeper than 1)."""
    g = g or member(meta.group)
    out = {e.name: torch.empty(e.shape, dtype=getattr(torch, e.dtype), device=g.device) for e in meta.entries}
    out |= {a: out[n] for a, n in meta.aliases.items()}
    receive(meta, g, out)
    return out


class Nccl(Transport):
    """``export`` broadcasts the bytes and returns their description; ``arrive`` receives them."""

    name = "nccl"

    class Options(Options):
        """``nodes.<sync>.transport_options`` of the ``nccl`` path."""

        bucket_mb: float = Field(256, ge=0.001, le=65_536)
        """Weights go in buckets of this size: the sender's and each receiver's extra GPU memory is two buckets,
        whatever the model's size."""

    def __init__(self, node, options=None):
        super().__init__(node, options)
        self.meta: NcclWeights | None = None
        self.bucket_bytes = int(self.settings.bucket_mb * (1 << 20))

    def export(self, state: WeightsState, version: int, fault=None) -> Weights:
        g = group(weights_group(self.node))
        if g is None:
            raise RuntimeError(f"{self.node}: the nccl weights path needs the group the executor forms before "
                               "step 0 (ray and ray-tasks executors)")
        if state.payload == "delta":            # positions and values: a new layout each export
            meta = describe(state.tensors, g.name, dtype=state.dtype, bucket_bytes=self.bucket_bytes)
        else:
            if self.meta is None:
                self.meta = describe(state.tensors, g.name, dtype=state.dtype, bucket_bytes=self.bucket_bytes)
            meta = self.meta
        send(meta, state.tensors, g, fault)
        return Weights(version, tensors=meta, payload=state.payload, nbytes=meta.nbytes, path=self.name)

    def arrive(self, weights: Weights, targets: Mapping[str, Any] | None = None) -> Weights:
        meta = weights.tensors
        if not isinstance(meta, NcclWeights):
            return weights
        if targets is not None:
            receive(meta, member(meta.group), targets)
            return Weights(weights.version, None, weights.payload, weights.nbytes, self.name, loaded=True)
        return Weights(weights.version, fetch(meta), weights.payload, weights.nbytes, self.name)
