"""Named tensors packed into one flat buffer per dtype: what the ``shm``, ``cuda-ipc`` and ``host`` paths carry.

:class:`TensorPack` is a read-only mapping ``name -> tensor`` whose tensors
are views of one flat buffer per dtype (tied weights are stored once). One
buffer instead of hundreds of tensors makes the export one copy kernel per
dtype and the transfer one message. How it pickles depends on its path:

- ``cuda-ipc``: only a CUDA IPC handle (a few hundred bytes). The sender keeps a few persistent packs and
  refills them in turn (:meth:`TensorPack.refill`, :class:`~omnigraph.transports.packed.CudaIpc`); a receiver
  opens each sender buffer once and keeps it open (:func:`_open_ipc`), then copies from it straight into the
  model's tensors when the weights arrive. (Through Ray's channel the tensor would otherwise go GPU -> host ->
  GPU at ~0.2 GB/s.)
- ``shm``: the buffer is a file in ``/dev/shm`` that the sender packs into
  directly; only its name is pickled, and the receiver maps the same pages
  (no copy until it loads them into its model) under a shared lock. A dropped
  pack deletes its files, or gives them back to the sender's pool
  (:mod:`.shmpool`), which refills one only when no receiver maps it.
- ``host``: the buffer itself, in host memory.

Checkpoints must not hold IPC handles or file names: ``base.portable()`` makes
every pack pickle as host memory while it is active.

>>> import torch
>>> a = torch.arange(6.0).reshape(2, 3)
>>> p = TensorPack.pack({"a": a, "b": torch.ones(2), "tied": a})
>>> sorted(p), p.nbytes, torch.equal(p["tied"], a), p.path
(['a', 'b', 'tied'], 32, True, 'host')
"""

from __future__ import annotations

import math
import os
import pickle
import weakref
from collections.abc import Mapping
from typing import Any, Iterator

import torch

from ..sdk.adapters.torch import foreach_copy_
from ..sdk.tensors import coalesce
from .base import portable
from .shmfiles import unlink
from .shmpool import new_buffer, open_shared

PATHS = ("cuda-ipc", "shm", "host")
_SENT: "weakref.WeakValueDictionary[int, TensorPack]" = weakref.WeakValueDictionary()


def device_uuid(index: int | None = None) -> str | None:
    """The physical identity of a visible CUDA device (the same in every process that sees it)."""
    try:
        i = torch.cuda.current_device() if index is None else index
        return str(torch.cuda.get_device_properties(i).uuid)
    except Exception:  # noqa: BLE001 - no CUDA, or no uuid on this build
        return None


class TensorPack(Mapping):
    """Named tensors in one flat buffer per dtype; ``layout``: ``name -> (dtype, shape, offset)``."""

    def __init__(self, buffers: dict[str, Any], layout: dict[str, tuple[str, tuple[int, ...], int]],
                 path: str = "host"):
        if path not in PATHS:
            raise ValueError(f"unknown tensor path {path!r} (one of {', '.join(PATHS)})")
        self.buffers = buffers
        self.layout = layout
        self.path = path
        self._views: dict[str, Any] = {}

    # -- building ------------------------------------------------------------
    @classmethod
    def pack(cls, tensors: Mapping[str, Any], *, dtype=None, device=None, path: str = "host",
             pool=None, plans: dict | None = None) -> "TensorPack":
        """Copy ``tensors`` (cast to ``dtype`` when given) into fresh flat buffers on ``device`` (``shm``: from
        ``pool``, a :class:`~omnigraph.transports.shmpool.Pool`, when given: it gets the files back when the
        pack is dropped). ``plans``: a dict the caller keeps between packs, where the layout and the copies are
        worked out once for the same mapping of the same tensors (no walk over them in Python each time)."""
        plan = _plan_for(tensors, dtype, plans)
        dev = device if device is not None else (plan.src[0].device if plan.src else "cpu")
        if path == "shm":
            buffers = {dt: (pool.take if pool is not None else new_buffer)(n, dt) for dt, n in plan.sizes.items()}
        else:
            buffers = {dt: torch.empty(n, dtype=getattr(torch, dt), device=dev) for dt, n in plan.sizes.items()}
        pack = cls(buffers, plan.layout, path)
        pack._plan = None
        pack._copy(plan.src, pack._targets(plan))
        if path == "shm":
            pack.files = {dt: b.og_file for dt, b in buffers.items()}
            if pool is not None:
                weakref.finalize(pack, pool.give_back, list(buffers.values()))
            else:
                weakref.finalize(pack, unlink, list(pack.files.values()))
        return pack

    def refill(self, tensors: Mapping[str, Any], *, dtype=None, plans: dict | None = None) -> bool:
        """Copy ``tensors`` into this pack's buffers in place, if they pack into the same layout (the same names,
        shapes, dtypes and tied names); False (nothing written) when they do not. ``plans`` as for :meth:`pack`:
        packs refilled in turn from the same tensors share one plan."""
        if not hasattr(self, "_plan"):
            return False                                  # not made by pack(): an opened or received buffer
        plan = _plan_for(tensors, dtype, plans)
        if plan is not self._plan and plan.layout != self.layout:
            return False
        self._copy(plan.src, self._targets(plan))
        return True

    def _targets(self, plan: "_Plan") -> list:
        """The views of this pack's buffers that ``plan``'s copies write (made once per plan)."""
        if self._plan is not plan:
            self._plan = plan
            self._views_of_plan = [self.buffers[dt][off:off + math.prod(shape)].view(shape)
                                   for dt, off, shape in plan.dst]
        return self._views_of_plan

    @staticmethod
    def _copy(src: list, dst: list) -> None:
        """``dst[i].copy_(src[i])`` for all ``i``, casting: one multi-tensor copy (a few kernels on a GPU; one
        copy where the sources lie in one buffer in the pack's order, :func:`~omnigraph.sdk.tensors.coalesce`)."""
        with torch.no_grad():
            if dst:
                foreach_copy_(dst, src)

    # -- the mapping ---------------------------------------------------------
    def __getitem__(self, name: str):
        v = self._views.get(name)
        if v is None:
            dt, shape, off = self.layout[name]
            v = self._views[name] = self.buffers[dt][off:off + math.prod(shape)].view(shape)
        return v

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout)

    def __len__(self) -> int:
        return len(self.layout)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    @property
    def device(self):
        return next(iter(self.buffers.values())).device if self.buffers else None

    def __repr__(self) -> str:
        return f"TensorPack({len(self)} tensors, {self.nbytes / 1e6:.1f} MB on {self.device}, path {self.path})"

    # -- crossing a process boundary -----------------------------------------
    def __reduce__(self):
        on_cuda = any(b.is_cuda for b in self.buffers.values())
        if portable.active() or (self.path == "host" and on_cuda):
            return TensorPack, ({k: b.cpu() for k, b in self.buffers.items()}, self.layout, "host")
        if self.path == "shm" and getattr(self, "files", None):
            return _open_shm, ({dt: (f, self.buffers[dt].numel()) for dt, f in self.files.items()}, self.layout)
        if self.path == "cuda-ipc" and on_cuda:
            from torch.multiprocessing.reductions import reduce_tensor
            handles = {k: (device_uuid(b.device.index), reduce_tensor(b)) for k, b in self.buffers.items()}
            _SENT[id(self)] = self
            if getattr(self, "_layout_blob", None) is None:     # pickled once: a receiver compares the bytes
                self._layout_blob = pickle.dumps(self.layout, protocol=pickle.HIGHEST_PROTOCOL)
            return _open_ipc, (handles, self._layout_blob, (os.getpid(), id(self)), getattr(self, "stamp", None))
        return TensorPack, (self.buffers, self.layout, self.path)


def _key(t) -> tuple:
    """Where a tensor's elements are: equal for tied names."""
    return (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))


def _where(tensors: Mapping[str, Any], names) -> list[tuple[str, Any, int]]:
    """``(name, tensor, address)`` of each name: what a cached copy plan was made for."""
    return [(n, tensors[n], tensors[n].data_ptr()) for n in names]


def _unchanged(tensors: Mapping[str, Any], where: list) -> bool:
    """The same tensor objects at the same addresses (a plan's flat views of their memory hold the old memory
    of a tensor whose ``.data`` was replaced)."""
    return all(tensors.get(n) is t and t.data_ptr() == p for n, t, p in where)


class _Plan:
    """How ``tensors`` pack (cast to ``dtype``): the layout (tied names once), each dtype buffer's size, and the
    copies, coalesced (:func:`~omnigraph.sdk.tensors.coalesce`): ``src[i]`` goes to ``dst[i] = (dtype, offset,
    shape)`` of the new buffers."""

    def __init__(self, tensors: Mapping[str, Any], dtype):
        self.tensors, self.dtype = tensors, dtype
        layout: dict[str, tuple[str, tuple[int, ...], int]] = {}
        sizes: dict[str, int] = {}
        seen: dict[tuple, str] = {}
        for name, t in tensors.items():
            key = _key(t)
            dt = str(dtype if dtype is not None and t.is_floating_point() else t.dtype).removeprefix("torch.")
            if key in seen and t.numel():                 # tied weights: one copy, two names
                layout[name] = layout[seen[key]]
                continue
            layout[name] = (dt, tuple(t.shape), sizes.get(dt, 0))
            sizes[dt] = sizes.get(dt, 0) + t.numel()
            seen[key] = name
        self.layout, self.sizes = layout, sizes
        self.sources = [(dt, n, off) for n, (dt, _, off) in layout.items()
                        if seen.get(_key(tensors[n])) == n or not tensors[n].numel()]
        # destinations as placeholder views of one scratch buffer per dtype laid out as the pack's: adjacent
        # exactly where the pack's are, so coalesce joins what is adjacent on both sides
        scratch = {dt: torch.empty(n, dtype=getattr(torch, dt), device="meta") for dt, n in sizes.items()}
        dst, self.src = coalesce([scratch[dt][off:off + math.prod(layout[n][1])].view(layout[n][1])
                                  for dt, n, off in self.sources], [tensors[n] for _, n, _ in self.sources])
        self.dst = [(str(d.dtype).removeprefix("torch."), d.storage_offset(), tuple(d.shape)) for d in dst]
        self.where = _where(tensors, tensors.keys())

    def fits(self, tensors: Mapping[str, Any], dtype) -> bool:
        return tensors is self.tensors and dtype == self.dtype and _unchanged(tensors, self.where)


def _plan_for(tensors: Mapping[str, Any], dtype, plans: dict | None) -> _Plan:
    """The kept plan when it fits ``tensors``, else a new one (kept in ``plans``)."""
    plan = plans.get("last") if plans is not None else None
    if plan is None or not plan.fits(tensors, dtype):
        plan = _Plan(tensors, dtype)
        if plans is not None:
            plans["last"] = plan
    return plan


def _open_ipc(handles: dict[str, tuple[str | None, tuple]], layout: bytes | dict, sender: tuple[int, int],
              stamp: tuple[str, int, int] | None = None) -> TensorPack:
    """Receiver side of ``cuda-ipc``: the sender's buffers, opened once per sender pack and kept open.

    The result *borrows* the sender's memory (``stamp``: where the sender says which version each of its buffers
    holds); the transport's ``arrive`` copies out of it at once (:class:`~omnigraph.transports.packed.CudaIpc`).
    A pack whose buffers are still the ones opened before is the same object as then (its views and the copy
    plans made for it stay valid). In the sending process itself (CUDA cannot open its own IPC handles) the pack
    is the original.
    """
    if sender[0] == os.getpid() and sender[1] in _SENT:
        return _SENT[sender[1]]
    buffers = {}
    for dt, (uuid, (rebuild, args)) in handles.items():
        index = _local_index(uuid)
        if index is None:
            raise RuntimeError(
                f"weights were sent as a CUDA IPC handle from GPU {uuid}, which this process does not see "
                f"(it sees {[device_uuid(i) for i in range(torch.cuda.device_count())]}); the pools that "
                "exchange weights must share one GPU for the cuda-ipc path (fractional pools.*.gpus on one host)")
        args = list(args)
        args[6] = index                  # storage_device: the same card under this process's numbering
        with torch.cuda.device(index):
            buffers[dt] = rebuild(*args)  # a buffer opened before (kept below) comes from torch's cache: no reopen
    old = _OPENED.get(sender)
    blob = layout if isinstance(layout, bytes) else None
    if old is not None and blob is not None and getattr(old, "_layout_blob", None) == blob:
        layout = old.layout                           # the same bytes as last time: no unpickling
    elif blob is not None:
        layout = pickle.loads(blob)
    same = old is not None and (old.layout is layout or old.layout == layout) and old.buffers.keys() == buffers.keys()
    if same and all(old.buffers[dt].data_ptr() == b.data_ptr() and old.buffers[dt].numel() == b.numel()
                    for dt, b in buffers.items()):
        pack = old
    else:
        pack = _OPENED[sender] = TensorPack(buffers, layout, "cuda-ipc")
        pack._layout_blob = blob
        while len(_OPENED) > OPEN_MAX:                # a sender that replaced its packs: close the oldest
            _OPENED.pop(next(iter(_OPENED)))
    pack.stamp = stamp
    return pack


_OPENED: dict[tuple[int, int], TensorPack] = {}      # (sender pid, sender pack) -> its opened buffers, kept open
OPEN_MAX = 8                                         # senders' packs kept open (a sender refills KEEP = 3 in turn)


def _open_shm(files: dict[str, tuple[str, int]], layout) -> TensorPack:
    """Receiver side of ``shm``: map the sender's files (same host), no copy; each under a shared lock while it is
    mapped, so that the sender does not reuse it (:mod:`.shmpool`)."""
    return TensorPack({dt: open_shared(path, n, dt) for dt, (path, n) in files.items()}, layout, "shm")


def _local_index(uuid: str | None) -> int | None:
    if not torch.cuda.is_available():
        return None
    for i in range(torch.cuda.device_count()):
        if uuid is None or device_uuid(i) == uuid:
            return i
    return None
