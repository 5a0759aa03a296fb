"""Process groups the executor forms before step 0: NCCL weights groups and data-parallel trainer groups.

Rank 0 opens a TCP store on a free port of its host (:func:`open_store`), then
every member joins through it at once (:func:`join`), with one warm-up
broadcast so that the communicator exists before the first real collective.
``gloo`` on CPUs (the CPU tests of the same logic), ``nccl`` between GPUs.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..sdk.adapters.torch import nccl_options

_STORES: dict[str, Any] = {}
_GROUPS: dict[str, "Group"] = {}


class Group:
    """One process's membership of a group, with the reusable bucket buffers of the weights path."""

    def __init__(self, name: str, pg, rank: int, world: int, device, store):
        self.name, self.pg, self.rank, self.world, self.device = name, pg, rank, world, device
        self.store = store                  # rank 0 serves the TCP store: keep it alive
        self.buffers: list[Any] = []
        self.inflight: dict[int, Any] = {}  # buffer -> its last broadcast (the sender reuses it after that)

    def broadcast(self, tensor):
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        return self.pg.broadcast([tensor], opts)

    def buffer(self, i: int, nbytes: int):
        while len(self.buffers) <= i:
            self.buffers.append(None)
        b = self.buffers[i]
        if b is None or b.numel() < nbytes:
            b = self.buffers[i] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return b


def open_store(name: str, host: str) -> tuple[str, int]:
    """On the sender (rank 0): a TCP store on a free port of this host; returns (host, port) to publish."""
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600))
    _STORES[name] = store
    return host, store.port


def join(name: str, host: str, port: int, rank: int, world: int, timeout_s: float = 3600.0,
         backend: str = "nccl", default: bool = False) -> Group:
    """Join group ``name`` (every member at once) and make its communicator with one warm-up broadcast.
    ``default``: as this process's default group (``init_process_group``), which a ``DeviceMesh`` and so
    FSDP2 need; a process has at most one (its sharded pool's)."""
    store = _STORES.pop(name, None)
    if store is None:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=600))
    prefixed = dist.PrefixStore(f"omnigraph/{name}/", store)
    if default:
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s), device_id=device if backend == "nccl" else None)
        pg = dist.group.WORLD
    elif backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        pg = dist.ProcessGroupNCCL(prefixed, rank, world, nccl_options(timedelta(seconds=timeout_s)))
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
    if g is not None and g.pg is dist.group.WORLD:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - leaving must not fail
            pass
    elif g is not None:
        g.buffers, g.inflight = [], {}
        abort = getattr(g.pg, "shutdown", None) or getattr(g.pg, "abort", None)
        if abort is not None:
            try:
                abort()
            except Exception:  # noqa: BLE001 - leaving must not fail
                pass


def member(name: str) -> Group:
    g = _GROUPS.get(name)
    if g is None:
        raise RuntimeError(f"weights arrived over NCCL (group {name}) but this process ({os.getpid()}) is not in "
                           "that group: the executor forms it before the first step (ray, ray-tasks)")
    return g

