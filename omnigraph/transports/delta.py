"""``sync: {payload: delta}``: after a dense first export, only the values that changed.

Sender (:class:`Encoder`, on the trainer's actor, before the transport): keeps the last exported copy of every
tensor in the wire dtype, the *base*. An export casts the weights to the wire dtype, compares bit patterns
with the base and, per tensor that changed, sends the flat positions (int32; int64 past 2**31 elements), the
new values, and two checksums: of the base's values at those positions (what the receiver must hold there)
and of the new values; a tensor most of whose values changed goes whole (positions would cost more). The base
is then updated in place. A weight whose change rounds away in the wire
dtype is not sent: in bf16 a small step leaves many weights as they were. Whatever path the plan chose
(``shm``, ``cuda-ipc``, ``nccl``, ...) carries the delta as it carries any mapping of tensors.

Receiver (:func:`apply`, on the rollout's actor, when the generator takes the version): checks that the
delta starts from the version it holds and that its own values at every position sum to the sender's
checksum; only then it writes the new values in place (into :meth:`~omnigraph.sdk.Generator.weight_targets`)
and checks the written ones. A mismatch raises :class:`DeltaMismatch`: a node failure, so the supervisor
restarts the actors from the newest checkpoint, and a new sender's first export is dense: the receivers are
re-seeded densely. A resume is the same (the base is not checkpointed).

Checksum: the sum of the values' bit patterns as int64, exact and independent of order.

>>> import torch
>>> enc = Encoder()
>>> w = {"w": torch.zeros(6, dtype=torch.bfloat16)}
>>> enc.encode(w, None, version=1).payload      # the first export is dense
'full'
>>> w["w"][2] = 1.0
>>> d = enc.encode(w, None, version=2)
>>> d.payload, d.tensors["w::idx"].tolist(), d.tensors["w::val"].tolist()
('delta', [2], [1.0])
>>> mine = {"w": torch.zeros(6, dtype=torch.bfloat16)}
>>> apply(d.tensors, mine, held=1)
>>> mine["w"].tolist()
[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..sdk import WeightsState
from . import delta_cpu

HEAD = "::delta"
"""int64 [base version, tensors changed, tensors in all]."""
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class DeltaMismatch(RuntimeError):
    """The receiver does not hold what the delta was computed against (a version skipped, weights written by
    someone else, a torn transfer): it must be re-seeded densely."""


def bits(t) -> Any:
    """``t`` flat, as integers of its size (bit patterns: -0.0 differs from 0.0, NaN equals itself)."""
    flat = t.reshape(-1)
    return flat if not (flat.is_floating_point() or flat.is_complex()) and flat.dtype != torch.bool \
        else flat.view(_BITS[flat.element_size()])


def checksum(flat_bits, idx) -> int:
    return int(flat_bits[idx].to(torch.int64).sum()) if idx.numel() else 0


class Encoder:
    """The sender's side: the base, and each export as the positions and values that changed since it."""

    def __init__(self):
        self.base: dict[str, Any] | None = None
        self.version = -1
        self.dense_bytes = 0
        self._idx, self._val = None, {}          # the CPU pass's scratch: positions and values, reused

    @torch.no_grad()
    def encode(self, tensors: Mapping[str, Any], dtype, version: int) -> WeightsState:
        def wire(v):
            return v.detach().to(dtype) if dtype is not None and v.is_floating_point() else v.detach()

        kind = {k: (v.shape, dtype if dtype is not None and v.is_floating_point() else v.dtype)
                for k, v in tensors.items()}
        if self.base is None or kind.keys() != self.base.keys() or any(
                kind[k] != (self.base[k].shape, self.base[k].dtype) for k in kind):
            self.base = {k: wire(t).clone().contiguous() for k, t in tensors.items()}
            self.version = version
            self.dense_bytes = sum(t.numel() * t.element_size() for t in self.base.values())
            return WeightsState(self.base, "full", None)
        out: dict[str, Any] = {}
        for k, v in tensors.items():
            if delta_cpu.fits(v.detach(), self.base[k]):
                self._diff_cpu(k, v.detach(), out)
            else:
                self._diff_torch(k, wire(v).contiguous(), out)
        changed = sum(1 for key in out if key.endswith(("::idx", "::all")))
        out[HEAD] = torch.tensor([self.version, changed, len(tensors)], dtype=torch.int64)
        self.version = version
        return WeightsState(out, "delta", None)

    @staticmethod
    def _whole(n: int, size: int) -> int:
        """Changed values from which a tensor goes whole: positions (int32) and values would cost more."""
        return -(-n * size // (4 + size))

    def _diff_torch(self, k: str, t, out: dict) -> None:
        new, old = bits(t), bits(self.base[k])
        idx = torch.ne(new, old).nonzero().squeeze(1)
        if not idx.numel():
            return
        idx = idx.to(torch.int32 if t.numel() < 2**31 else torch.int64)
        if idx.numel() * (idx.element_size() + t.element_size()) >= t.numel() * t.element_size():
            out[f"{k}::all"] = t.reshape(-1)          # most of it changed: whole is smaller than positions
            self.base[k].copy_(t)
            return
        vals = t.reshape(-1)[idx]
        out[f"{k}::sum"] = torch.tensor([checksum(old, idx), checksum(new, idx)], dtype=torch.int64,
                                        device=t.device)
        self.base[k].view(-1)[idx] = vals
        out[f"{k}::idx"], out[f"{k}::val"] = idx, vals

    def _diff_cpu(self, k: str, master, out: dict) -> None:
        """:meth:`_diff_torch`'s result in one pass over ``master`` (:mod:`.delta_cpu`)."""
        base = self.base[k]
        cap = self._whole(base.numel(), base.element_size()) - 1
        if self._idx is None or self._idx.numel() < cap:
            self._idx = torch.empty(max(cap, 1), dtype=torch.int32)
        val = self._val.get(base.dtype)
        if val is None or val.numel() < cap:
            val = self._val[base.dtype] = torch.empty(max(cap, 1), dtype=base.dtype)
        n, pre, post = delta_cpu.diff(master, base, self._idx[:cap], val[:cap])
        if n < 0:                                     # most of it changed: whole is smaller than positions
            whole = master.to(base.dtype).reshape(-1)
            base.view(-1).copy_(whole)
            out[f"{k}::all"] = whole
        elif n:
            out[f"{k}::idx"], out[f"{k}::val"] = self._idx[:n].clone(), val[:n].clone()
            out[f"{k}::sum"] = torch.tensor([pre, post], dtype=torch.int64)


def delta_bytes(tensors: Mapping[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for k, t in tensors.items() if k != HEAD)


@torch.no_grad()
def apply(tensors: Mapping[str, Any], targets: Mapping[str, Any], held: int, corrupt: bool = False) -> None:
    """Write the delta ``tensors`` into ``targets`` in place, after checking that they hold its base version
    (``held``) at every position; raise :class:`DeltaMismatch` (nothing written) when they do not.
    ``corrupt``: a test's fault, one value of the targets changed first, as a stray write would."""
    base, _, total = (int(x) for x in tensors[HEAD].tolist())
    if base != held:
        raise DeltaMismatch(f"a weights delta from version {base} reached a generator holding version {held}")
    names = [k[:-len("::idx")] for k in tensors if k.endswith("::idx")]
    whole = [k[:-len("::all")] for k in tensors if k.endswith("::all")]
    missing = [n for n in names + whole if n not in targets]
    if missing or len(targets) != total:
        raise DeltaMismatch(f"the delta names {len(names)} tensors of {total}, the generator holds {len(targets)} "
                            f"({', '.join(missing[:3]) or 'other names'} not among them)")
    if corrupt and names:
        flat = targets[names[0]].view(-1)
        flat[int(tensors[f"{names[0]}::idx"][0])] += 1
    work = []
    for n in names:
        t = targets[n]
        vals = tensors[f"{n}::val"].to(t.device, non_blocking=True)
        if vals.dtype != t.dtype or not t.is_contiguous():
            raise DeltaMismatch(f"the delta of {n} is {vals.dtype}, the generator holds {t.dtype}"
                                + ("" if t.is_contiguous() else " (not contiguous)") +
                                ": a delta applies only where the rollout keeps the dtype the weights travel in")
        idx = tensors[f"{n}::idx"]
        fast = delta_cpu.fits(t, t)
        idx = idx if fast else idx.to(t.device, torch.int64)
        pre, post = tensors[f"{n}::sum"].tolist()
        if (delta_cpu.apply_at(t, idx, None) if fast else checksum(bits(t), idx)) != pre:
            raise DeltaMismatch(f"{n}: the generator's values at the {idx.numel()} changed positions are not those "
                                f"of version {base} the delta was computed from (checksum)")
        work.append((t, idx, vals, post, fast))
    for n in whole:
        src, t = tensors[f"{n}::all"], targets[n]
        if src.dtype != t.dtype or src.numel() != t.numel():
            raise DeltaMismatch(f"{n}: {src.numel()} values of {src.dtype} sent for a tensor of {t.numel()} {t.dtype}")
    for t, idx, vals, post, fast in work:
        if fast:
            written = delta_cpu.apply_at(t, idx, vals.contiguous())
        else:
            t.view(-1).index_copy_(0, idx, vals)
            written = checksum(bits(t), idx)
        if written != post:
            raise DeltaMismatch("the values written differ from the values sent (checksum after writing)")
    for n in whole:
        targets[n].view(-1).copy_(tensors[f"{n}::all"].reshape(-1), non_blocking=True)
