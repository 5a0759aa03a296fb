"""The transports that carry one :class:`~omnigraph.transports.pack.TensorPack` (or plain tensors).

- ``shm``: a ``/dev/shm`` file per dtype; the pack pickles as file names and the receiver maps them;
- ``cuda-ipc``: the pack pickles as CUDA IPC handles; the receiver copies device to device;
- ``host``: one flat buffer per dtype in host memory, pickled through the channel;
- ``channel``: the tensors as they are (a copy, so later updates do not reach the snapshot).

Senders keep their newest packs alive while a receiver may still be opening them: with two steps in
flight, a receiver has opened every export older than the newest :data:`KEEP`.
"""

from __future__ import annotations

from collections import deque

import torch

from ..sdk import Weights, WeightsState
from .base import Transport
from .pack import TensorPack

KEEP = 3


class _Packed(Transport):
    path = "host"

    def __init__(self, node, options=None):
        super().__init__(node, options)
        self.kept: deque = deque(maxlen=KEEP)

    def export(self, state: WeightsState, version: int, fault=None) -> Weights:
        pack = TensorPack.pack(state.tensors, dtype=state.dtype, path=self.path)
        if fault is not None:
            fault("export")               # packed, not handed over yet
        if self.path == "host" and pack.device is not None and pack.device.type == "cuda":
            pack = TensorPack({k: b.cpu() for k, b in pack.buffers.items()}, pack.layout, "host")
        if pack.device is not None and pack.device.type == "cuda":
            torch.cuda.current_stream(pack.device).synchronize()
        self.kept.append(pack)
        return Weights(version, tensors=pack, payload=state.payload, nbytes=pack.nbytes, path=self.name)

    def close(self) -> None:
        self.kept.clear()


class Shm(_Packed):
    name = path = "shm"


class CudaIpc(_Packed):
    name = path = "cuda-ipc"


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
