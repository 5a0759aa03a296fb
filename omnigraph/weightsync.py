"""Weights over NCCL: a torch.distributed group from the trainer to every rollout replica.

When ``sync`` and every consumer of its weights sit on whole GPUs of their
own (``pools.*.gpus >= 1``), the bytes do not travel through the graph's
channels at all (Ray 2.60's Compiled Graph NCCL channels assert on our
programs: FACTS.md). Instead:

- before the first step the executor forms one NCCL group per such ``sync``
  node (:func:`weight_groups`): rank 0 is the actor that runs ``sync``, ranks
  1.. the consumer actors; rank 0 opens a TCP store on a free port of its host
  (:func:`open_store`) and every member joins through it (:func:`join`), all at
  once, with one warm-up broadcast so the communicator exists before the
  first sync (lazily, NCCL would block the sender until the receivers join);
- ``sync`` describes the tensors once (:func:`describe`: names, shapes, wire
  dtypes, the bucket layout) and :func:`send` broadcasts them bucket by
  bucket: each bucket is cast into one of two reusable buffers of
  ``sync.bucket_mb`` and broadcast, so the sender's extra memory is two
  buckets whatever the model's size. The host does not wait for the
  receivers: the broadcasts queue on the GPU;
- the :class:`NcclWeights` value that travels through the graph carries only
  that description (a few kB); on each rollout actor the harness calls
  :func:`receive` when the value arrives (the ``apply`` task), in the order the
  sender sent, bucket by bucket straight into the model's parameters.

Tensors larger than a bucket are split over several buckets. Pure torch: the
executors call :func:`open_store` and :func:`join` through their actors.

>>> import torch
>>> meta = describe({"a": torch.zeros(3, 4), "b": torch.zeros(10, dtype=torch.int64), "t": None}, "g",
...                 dtype=torch.bfloat16, bucket_bytes=256)
>>> [(e.name, e.dtype, e.shape) for e in meta.entries], meta.nbytes
([('a', 'bfloat16', (3, 4)), ('b', 'int64', (10,))], 104)
>>> [[(p.name, p.start, p.numel, p.offset) for p in b.pieces] for b in meta.buckets]
[[('a', 0, 12, 0)], [('b', 0, 10, 0)]]
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping

ALIGN = 256
"""Byte alignment of every piece in a bucket (any dtype can be viewed there)."""


# ---------------------------------------------------------------- which path

def choose_path(spec, node: str) -> str:
    """How the weights exported by ``node`` reach its consumers: ``nccl``, ``cuda-ipc``, ``device``, ``shm``
    or ``host``.

    On a CPU trainer pool: ``shm`` on one host (a ``/dev/shm`` file; only its name crosses), ``host`` on a
    cluster (``runtime.address``: the tensors cross the channel).
    ``nccl`` when the exporting pool and every consumer's pool have whole GPUs (``gpus >= 1``), the
    consumers are on other pools and no weights edge asks for ``transport: shm``; ``cuda-ipc`` when all
    have fractions of one card on one host; ``device`` between whole GPUs otherwise; else ``host``.
    """
    pool = spec.nodes[node].pool
    outs = [e for e in spec.edges if e.src == node and e.dst in spec.nodes]
    pools = [spec.pools[pool]] + [spec.pools[spec.nodes[e.dst].pool] for e in outs]
    if pools[0].gpus <= 0:
        return "host" if spec.runtime.address else "shm"
    if outs and not spec.runtime.address and all(0 < p.gpus < 1 for p in pools):
        return "cuda-ipc"
    if all(p.gpus >= 1 for p in pools):
        remote = all(spec.nodes[e.dst].pool != pool for e in outs)
        return "nccl" if outs and remote and all(e.transport != "shm" for e in outs) else "device"
    return "host"


def weights_path(spec, node: str) -> str:
    """The path ``node``'s weights take at run time: :func:`choose_path`, unless ``OMNIGRAPH_WEIGHTS_PATH``
    forces one (benchmarks and tests use it to compare paths)."""
    return os.environ.get("OMNIGRAPH_WEIGHTS_PATH") or choose_path(spec, node)


def group_name(node: str) -> str:
    return f"weights-{node}"


def weight_groups(plan) -> dict[str, list[str]]:
    """The NCCL groups a plan needs: group name -> member actors, the sender first (rank 0)."""
    from .errors import GraphError
    groups: dict[str, list[str]] = {}
    for c in plan.channels:
        if not (c.edge.state and c.transport == "nccl"):
            continue
        members = groups.setdefault(group_name(c.edge.src), [c.src.actor])
        if c.dst.actor in members:
            raise GraphError(f"actor {c.dst.actor} would receive the weights of '{c.edge.src}' over NCCL twice "
                             "(two weights edges into one actor, or into the sender's own actor)",
                             where=f"edges.{c.edge.src} -> {c.edge.dst}",
                             fix="send the weights to one node per pool, or set transport: shm on the edge")
        members.append(c.dst.actor)
    return groups


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
    pending = True                  # the bytes are still to be received (the harness does it on arrival)

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


class InModel:
    """The weights of a version already received into the consumer's model (nothing left to load)."""

    in_model = True

    def __init__(self, meta: NcclWeights):
        self.count, self.nbytes, self.path = len(meta), meta.nbytes, "nccl"

    def __len__(self) -> int:
        return self.count


def _itemsize(dtype: str) -> int:
    import torch
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


# ---------------------------------------------------------------- the group

_STORES: dict[str, Any] = {}
_GROUPS: dict[str, "Group"] = {}


class Group:
    """One process's membership of a weights group, with its reusable bucket buffers."""

    def __init__(self, name: str, pg, rank: int, world: int, device, store):
        self.name, self.pg, self.rank, self.world, self.device = name, pg, rank, world, device
        self.store = store                  # rank 0 serves the TCP store: keep it alive
        self.buffers: list[Any] = []
        self.inflight: dict[int, Any] = {}  # buffer -> its last broadcast (the sender reuses it after that)

    def broadcast(self, tensor):
        import torch.distributed as dist
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        return self.pg.broadcast([tensor], opts)

    def buffer(self, i: int, nbytes: int):
        import torch
        while len(self.buffers) <= i:
            self.buffers.append(None)
        b = self.buffers[i]
        if b is None or b.numel() < nbytes:
            b = self.buffers[i] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return b


def open_store(name: str, host: str) -> tuple[str, int]:
    """On the sender (rank 0): a TCP store on a free port of this host; returns (host, port) to publish."""
    import torch.distributed as dist
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600))
    _STORES[name] = store
    return host, store.port


def join(name: str, host: str, port: int, rank: int, world: int, timeout_s: float = 3600.0,
         backend: str = "nccl") -> Group:
    """Join group ``name`` (every member at once) and make its communicator with one warm-up broadcast."""
    import torch
    import torch.distributed as dist
    store = _STORES.pop(name, None)
    if store is None:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=600))
    prefixed = dist.PrefixStore(f"omnigraph/{name}/", store)
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout_s)
        pg = dist.ProcessGroupNCCL(prefixed, rank, world, opts)
    else:                                   # gloo: the CPU tests of the same logic
        device = torch.device("cpu")
        pg = dist.ProcessGroupGloo(prefixed, rank, world, timedelta(seconds=timeout_s))
    group = Group(name, pg, rank, world, device, store)
    probe = torch.full((1,), 7.0 if rank == 0 else 0.0, device=device)
    group.broadcast(probe).wait()
    if float(probe) != 7.0:
        raise RuntimeError(f"weights group {name}: the warm-up broadcast gave {float(probe)} instead of 7")
    _GROUPS[name] = group
    return group


def group(name: str) -> Group | None:
    return _GROUPS.get(name)


def leave(name: str) -> None:
    g = _GROUPS.pop(name, None)
    if g is not None:
        g.buffers, g.inflight = [], {}
        abort = getattr(g.pg, "shutdown", None) or getattr(g.pg, "abort", None)
        if abort is not None:
            try:
                abort()
            except Exception:  # noqa: BLE001 - leaving must not fail
                pass


# ---------------------------------------------------------------- moving the bytes

def _views(buf, bucket: Bucket, sizes: dict[str, tuple[Any, int]]):
    for p in bucket.pieces:
        dt, size = sizes[p.name]
        yield p, buf[p.offset:p.offset + p.numel * size].view(dt)


def _dtypes(meta: NcclWeights) -> dict[str, tuple[Any, int]]:
    import torch
    return {e.name: (getattr(torch, e.dtype), _itemsize(e.dtype)) for e in meta.entries}


def send(meta: NcclWeights, tensors: Mapping[str, Any], g: Group) -> None:
    """Broadcast ``tensors`` as ``meta`` says, from rank 0. Returns once every bucket is queued on the GPU:
    the receivers take them when they get there (their ``apply``), and the next send reuses the buffers
    only after these broadcasts are done."""
    import torch
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


def receive(meta: NcclWeights, g: Group, targets: Mapping[str, Any]) -> None:
    """Receive the broadcast ``meta`` describes into ``targets`` (name -> contiguous tensor, e.g. the model's
    own parameters), bucket by bucket; returns when the bytes are in place."""
    import torch
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
    import torch
    g = g or member(meta.group)
    out = {e.name: torch.empty(e.shape, dtype=getattr(torch, e.dtype), device=g.device) for e in meta.entries}
    out |= {a: out[n] for a, n in meta.aliases.items()}
    receive(meta, g, out)
    return out


def member(name: str) -> Group:
    g = _GROUPS.get(name)
    if g is None:
        raise RuntimeError(f"weights arrived over NCCL (group {name}) but this process ({os.getpid()}) is not in "
                           "that group: the executor forms it before the first step (ray, ray-tasks)")
    return g
