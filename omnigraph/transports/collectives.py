"""The collectives of a data-parallel pool: an update node on a pool of several actors.

Every trainer actor holds the same weights (same seed, same initialisation)
and receives its share of each batch (whole prompt groups, ``SampleBatch.shard``).
The update then runs as one optimizer over the whole batch:

- the ranks agree on the number of mini-batches (the largest shard decides;
  a rank whose share of a mini-batch is empty contributes zero gradient);
- each mini-batch's loss is divided by the token count of the *whole*
  mini-batch (summed over ranks), and the gradients are summed over ranks in
  one flat all-reduce before clipping, so the step equals the single-actor
  step on the whole mini-batch (up to the order of float additions);
- every rank applies the same AdamW step: the weights stay identical, and
  ``sync`` exports them from rank 0.

The group is a torch.distributed process group that the executor forms before
step 0 (the same way as the NCCL weights groups, :mod:`omnigraph.transports.groups`):
``gloo`` on CPUs, ``nccl`` between trainer actors on whole GPUs of their own.
Nodes reach it as ``ctx.collectives`` (:class:`PoolCollectives`, the SDK's
``Collectives`` protocol).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from . import groups, pool_group

def of(actor: str, world: int, sharded: bool = False) -> "PoolCollectives | None":
    """The collectives of ``actor``'s data-parallel pool (None on a single actor), or of its sharded pool
    (a group of one rank too: FSDP2 shards over its mesh)."""
    if world == 1 and not sharded:
        return None
    g = groups.group(pool_group(actor.rsplit(".", 1)[0]))
    if g is None:
        raise RuntimeError(f"{actor} trains data-parallel with {world} actors but has no process group: "
                           "only the ray and ray-tasks executors form one (runtime.executor)")
    return PoolCollectives(g)


FAILED = "failed"
"""The store key a rank sets when its node fails: its peers stop waiting in a collective (a rank that
raised never joins the all-reduce its peers are in; without this they would wait out the step timeout)."""


def mark_failed(actor: str, reason: str) -> None:
    """Called by the interpreter when a node of ``actor`` fails: tell the actor's data-parallel peers."""
    g = groups.group(pool_group(actor.rsplit(".", 1)[0]))
    if g is not None:
        try:
            g.store.set(f"{g.name}/{FAILED}", f"{actor}: {reason}"[:500])
        except Exception:  # noqa: BLE001 - the peers then wait for the step timeout, as before
            pass


def _peer_failure(g) -> str | None:
    key = f"{g.name}/{FAILED}"
    try:
        return g.store.get(key).decode() if g.store.check([key]) else None
    except Exception:  # noqa: BLE001 - the store's host (rank 0) is gone: so is the group
        return "rank 0 is gone"


def _reduce(g, tensor, op):
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    work = g.pg.allreduce([tensor], opts)
    t0, check = time.monotonic(), 0.05
    while not work.is_completed():       # poll, so that a failed peer is noticed within ~50 ms
        time.sleep(0.0002)
        if time.monotonic() - t0 > check:
            check += 0.05
            failed = _peer_failure(g)
            if failed:
                raise RuntimeError(f"a data-parallel peer failed ({failed}): this rank stops waiting for it")
    work.wait()
    return tensor


class PoolCollectives:
    """``ctx.collectives`` of a data-parallel trainer rank (the SDK's ``Collectives``)."""

    def __init__(self, g):
        self.g = g
        self._mesh = None

    def mesh(self):
        """The pool's DeviceMesh (a sharded pool's group is its processes' default group: ``groups.join``)."""
        if self._mesh is None:
            if self.g.pg is not dist.group.WORLD:
                raise RuntimeError(f"group {self.g.name} is not a sharded pool's: it has no device mesh")
            from torch.distributed.device_mesh import init_device_mesh
            self._mesh = init_device_mesh(self.g.device.type, (self.g.world,))
        return self._mesh

    def all_sum(self, value: float) -> float:
        dtype = torch.float64 if self.g.device.type == "cpu" else torch.float32
        return float(_reduce(self.g, torch.tensor([float(value)], dtype=dtype, device=self.g.device),
                             dist.ReduceOp.SUM))

    def all_max(self, value: int) -> int:
        return int(_reduce(self.g, torch.tensor([int(value)], dtype=torch.int64, device=self.g.device),
                           dist.ReduceOp.MAX))

    def sum_grads(self, params: list) -> None:
        """Sum the gradients of ``params`` over the group, in one flat buffer (missing grads count as zero)."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([x.reshape(-1) for x in grads])
        _reduce(self.g, flat, dist.ReduceOp.SUM)
        at = 0
        for x in grads:
            x.copy_(flat[at:at + x.numel()].view_as(x))
            at += x.numel()
