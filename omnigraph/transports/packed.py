"""The transports that carry one :class:`~omnigraph.transports.pack.TensorPack` (or plain tensors).

- ``shm``: a ``/dev/shm`` file per dtype; the pack pickles as file names and the receiver maps them;
- ``cuda-ipc``: the pack pickles as CUDA IPC handles; the receiver copies device to device;
- ``host``: one flat buffer per dtype in host memory, pickled through the channel;
- ``channel``: the tensors as they are (a copy, so later updates do not reach the snapshot).

Senders keep their newest packs alive while a receiver may still be opening them: with two steps in
flight, a receiver has opened every export older than the newest :data:`KEEP`.

``cuda-ipc`` is built for device-copy speed (:class:`CudaIpc`): the sender refills :data:`KEEP` persistent
packs in turn (one multi-tensor copy and cast per export), a receiver keeps each one's buffers open, and on
arrival copies straight from them into the generator's own tensors (:func:`omnigraph.sdk.copy_into`).
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Mapping

import torch

from ..sdk import Weights, WeightsState, copy_into
from .base import Transport
from .pack import TensorPack
from .shmpool import Pool
from .shmfiles import name, unlink

KEEP = 3


class _Packed(Transport):
    path = "host"

    def __init__(self, node, options=None):
        super().__init__(node, options)
        self.kept: deque | None = None
        self.pack_plans: dict = {}              # TensorPack.pack's layout and copies, worked out once

    @property
    def keep(self) -> int:
        """Packs the sender keeps: :data:`KEEP`, more when the plan can leave more exports unread."""
        return max(KEEP, self.in_flight)

    def export(self, state: WeightsState, version: int, fault=None) -> Weights:
        pack = TensorPack.pack(state.tensors, dtype=state.dtype, path=self.path, plans=self.pack_plans)
        if fault is not None:
            fault("export")               # packed, not handed over yet
        if self.path == "host" and pack.device is not None and pack.device.type == "cuda":
            pack = TensorPack({k: b.cpu() for k, b in pack.buffers.items()}, pack.layout, "host")
        if pack.device is not None and pack.device.type == "cuda":
            torch.cuda.current_stream(pack.device).synchronize()
        self._keep_pack(pack)
        return Weights(version, tensors=pack, payload=state.payload, nbytes=pack.nbytes, path=self.name)

    def _keep_pack(self, pack) -> None:
        if self.kept is None:
            self.kept = deque(maxlen=self.keep)
        self.kept.append(pack)

    def close(self) -> None:
        if self.kept is not None:
            self.kept.clear()


class Shm(_Packed):
    """``/dev/shm`` files, reused once no receiver maps them (:mod:`.shmpool`): an export writes into pages
    written before, at memory speed."""
    name = path = "shm"

    def __init__(self, node, options=None):
        super().__init__(node, options)
        self.pool = Pool()

    def export(self, state: WeightsState, version: int, fault=None) -> Weights:
        pack = TensorPack.pack(state.tensors, dtype=state.dtype, path=self.path, pool=self.pool,
                               plans=self.pack_plans)
        if fault is not None:
            fault("export")               # packed, not handed over yet
        self._keep_pack(pack)
        return Weights(version, tensors=pack, payload=state.payload, nbytes=pack.nbytes, path=self.name)

    def close(self) -> None:
        super().close()
        self.pool.close()


class CudaIpc(_Packed):
    """Weights between processes sharing one GPU, at device-copy speed.

    Sender: export ``v`` refills pack ``v % KEEP`` in place (one ``_foreach_copy_``, casting to the wire dtype),
    waits for the copy to finish, and hands over the pack, which pickles as its CUDA IPC handle. Receiver: the
    handle of a pack it has seen opens from cache (:func:`~omnigraph.transports.pack._open_ipc`); on arrival
    (the plan's apply task) it copies the buffer straight into the generator's tensors
    (:meth:`~omnigraph.sdk.Generator.weight_targets`; the weights are then ``loaded``), or into memory of its
    own when it keeps the weights for later (a delay > 1), and waits for that copy. So a pack must stay
    unchanged only from its export until each receiver's arrival has copied it out.

    Why :data:`KEEP` = 3 packs suffice: a rollout actor runs its ops in order, so the arrival of export ``i``
    finishes before that actor's ``generate`` of iteration ``i + 1``; the trainer's export ``i + d + 1`` needs the
    batch that ``generate`` made, ``d`` being the delay of the data edge into the trainer (0 in sync, 1
    one-step-off, k with ``async: ahead: k``). So at most ``d + 1`` exports are unread at a time: 3 packs cover
    ``d <= 2``; for a longer delay the plan says so (``in_flight``: the staleness bound + 1, which covers ``d + 1``)
    and the ring has that many packs (each a copy of the weights on the GPU). For anything unforeseen, every
    pack carries a stamp in a host shared-memory file
    (``/dev/shm``): the version it holds, -1 while being refilled. A receiver checks it before and after its
    copy and raises if the sender has overwritten the version it is reading, instead of loading torn weights.
    """
    name = path = "cuda-ipc"

    def __init__(self, node, options=None):
        super().__init__(node, options)
        self.ring: list[TensorPack | None] = []
        self.exports = 0
        self.stamps = None                      # the sender's stamp file, int64[KEEP]
        self.stamps_path = ""
        self.opened: dict[str, Any] = {}        # receiver: stamp files by path
        self.plans: dict = {}                   # receiver: copy_into's matched lists

    def export(self, state: WeightsState, version: int, fault=None) -> Weights:
        if self.stamps is None:
            self.ring = [None] * self.keep
            self.stamps_path = name("/dev/shm", os.environ.get("OMNIGRAPH_SHM_TAG", str(os.getpid())), os.getpid(),
                                    id(self), "stamps")
            self.stamps = torch.from_file(self.stamps_path, shared=True, size=len(self.ring), dtype=torch.int64)
            self.stamps.fill_(-1)
        slot = self.exports % len(self.ring)
        self.exports += 1
        self.stamps[slot] = -1                  # being refilled: a receiver still reading it must not trust it
        pack = self.ring[slot]
        if pack is None or not pack.refill(state.tensors, dtype=state.dtype, plans=self.pack_plans):
            pack = self.ring[slot] = TensorPack.pack(state.tensors, dtype=state.dtype, path=self.path,
                                                     plans=self.pack_plans)
        if fault is not None:
            fault("export")
        if pack.device is not None and pack.device.type == "cuda":
            torch.cuda.current_stream(pack.device).synchronize()
        self.stamps[slot] = version
        pack.stamp = (self.stamps_path, slot, len(self.ring))
        return Weights(version, tensors=pack, payload=state.payload, nbytes=pack.nbytes, path=self.name)

    def arrive(self, weights: Weights, targets: Mapping[str, Any] | None = None) -> Weights:
        pack = weights.tensors
        stamp = getattr(pack, "stamp", None)
        if not isinstance(pack, TensorPack) or stamp is None:
            return weights                      # not a borrowed buffer (a checkpoint's host copy, ...)
        t0 = time.perf_counter()
        self._check(stamp, weights.version, "before")
        if targets is not None:
            copy_into(targets, pack, self.plans)
            out = Weights(weights.version, payload=weights.payload, nbytes=weights.nbytes, path=weights.path,
                          loaded=True)
        else:
            own = TensorPack({dt: b.clone() for dt, b in pack.buffers.items()}, pack.layout, pack.path)
            out = Weights(weights.version, tensors=own, payload=weights.payload, nbytes=weights.nbytes,
                          path=weights.path)
        if pack.device is not None and pack.device.type == "cuda":
            torch.cuda.current_stream(pack.device).synchronize()
        self._check(stamp, weights.version, "while")
        out.arrive_s = time.perf_counter() - t0
        return out

    def _check(self, stamp: tuple[str, int], version: int, when: str) -> None:
        path, slot, size = stamp
        if path not in self.opened:
            if not os.path.exists(path):
                raise RuntimeError(f"the weights' stamp file {path} is gone: the sender of version {version} "
                                   "stopped before this receiver read it")
            self.opened[path] = torch.from_file(path, shared=True, size=size, dtype=torch.int64)
        held = int(self.opened[path][slot])
        if held != version:
            raise RuntimeError(f"weights version {version} was overwritten by the sender {when} this receiver copied "
                               f"it (its buffer now holds {held if held >= 0 else 'a version being written'}): more "
                               f"than {size} exports were in flight, the sender keeps {size} (the plan's staleness "
                               "bound + 1; transports/packed.py)")

    def close(self) -> None:
        super().close()
        self.ring = []
        if self.stamps_path:
            unlink([self.stamps_path])


class Host(_Packed):
    name = path = "host"


class Channel(Transport):
    name = "channel"

    @torch.no_grad()
    def export(self, state: WeightsState, version: int, fault=None) -> Weights:
        wire = state.dtype
        tensors = {k: v.detach().to(wire if wire is not None and v.is_floating_point() else v.dtype, copy=True)
                   for k, v in state.tensors.items()}
        if fault is not None:
            fault("export")
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return Weights(version, tensors=tensors, payload=state.payload, nbytes=nbytes, path=self.name)


class Rdt(Channel):
    """``rdt`` (the ``ray-tasks`` executor only): the tensors as they are, like ``channel``, but the executor
    submits the exporting call with Ray Direct Transport (``tensor_transport``): the object store keeps only a
    reference, and each receiver pulls the tensors from the trainer's actor over a gloo group."""
    name = "rdt"
