"""A delta's diff and its application on the CPU in one pass each (numba), for :mod:`omnigraph.transports.delta`.

In plain torch an export's diff takes six passes over every weight: the cast to the wire dtype, the comparison
with the base, ``nonzero`` (two passes of its own), the gathers of old and new values at the changed positions
for the checksums, and the write into the base. On one core of a 2-core AMD EPYC that is about 0.8 s for
SmolLM2-135M, more than the bytes it saves on a link of a few hundred MB/s. :func:`diff` does it in one:
for each value, the wire value from the master's bits (float32 to bfloat16 rounded to nearest even, as torch
casts, a NaN as torch casts a NaN of its sign here; or the same bits where the master is already in the wire
dtype), compared with the base, and where
they differ the position and value appended, both checksums summed and the base written. :func:`apply_at`
is the receiver's: the checksum of what it holds at the positions, then the writes and the checksum of what it
wrote, over the changed positions only.

The results are the torch path's bit for bit (``tests/test_delta.py`` compares them, NaNs, infinities and
signed zeros included). Where numba is missing or a tensor is of another kind (on a GPU, past 2**31 values,
a dtype pair not listed), :mod:`~omnigraph.transports.delta` keeps its torch path.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

_KERNELS: dict = {}
_LOCK = threading.Lock()

SIGNED = {2: torch.int16, 4: torch.int32}
"""The integer views (bit patterns, signed: the checksums sum them so) of the 16- and 32-bit dtypes."""


def _diff_f32_bf16(src, base, idx, val, nan_pos, nan_neg):
    """``src`` float32 bits (int32), ``base`` bfloat16 bits (int16): ``(changed, pre, post)``, ``changed`` ``-1``
    when more than ``idx`` can hold (the caller sends the tensor whole). ``nan_pos``, ``nan_neg``: the bits
    torch casts a NaN of each sign to."""
    k, pre, post = 0, 0, 0
    for i in range(src.size):
        x = np.int64(src[i]) & 0xFFFFFFFF
        if (x & 0x7FFFFFFF) > 0x7F800000:
            b = nan_neg if x >= 0x80000000 else nan_pos
        else:                                       # round to nearest, ties to even
            b = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF
            if b >= 0x8000:
                b -= 0x10000
        o = np.int64(base[i])
        if b != o:
            if k == idx.size:
                return -1, 0, 0
            idx[k] = i
            val[k] = b
            base[i] = b
            pre += o
            post += b
            k += 1
    return k, pre, post


def _diff_same(src, base, idx, val, nan_pos, nan_neg):
    """As :func:`_diff_f32_bf16`, with ``src`` already in the wire dtype (bits of ``base``'s size)."""
    k, pre, post = 0, 0, 0
    for i in range(src.size):
        b = src[i]
        o = base[i]
        if b != o:
            if k == idx.size:
                return -1, 0, 0
            idx[k] = i
            val[k] = b
            base[i] = b
            pre += np.int64(o)
            post += np.int64(b)
            k += 1
    return k, pre, post


def _sum_at(bits, idx):
    s = 0
    for j in range(idx.size):
        s += np.int64(bits[idx[j]])
    return s


def _write_at(bits, idx, val):
    s = 0
    for j in range(idx.size):
        bits[idx[j]] = val[j]
        s += np.int64(bits[idx[j]])
    return s


def _compile() -> dict:
    import numba

    jit = numba.njit(nogil=True, cache=True)
    nan = torch.tensor([float("nan"), -float("nan")]).to(torch.bfloat16).view(torch.int16).tolist()
    return {"nan": nan, "f32_bf16": jit(_diff_f32_bf16), "same": jit(_diff_same), "sum_at": jit(_sum_at),
            "write_at": jit(_write_at)}


def _kernels() -> dict | None:
    with _LOCK:
        if "k" not in _KERNELS:
            try:
                _KERNELS["k"] = _compile()
            except ImportError:
                _KERNELS["k"] = None
        return _KERNELS["k"]


def _np(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's bits as a signed integer array of its element size, sharing its memory."""
    return t.reshape(-1).view(SIGNED[t.element_size()]).numpy()


def fits(master: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether :func:`diff` takes this pair (else the torch path)."""
    if master.device.type != "cpu" or not master.is_contiguous() or master.numel() >= 2**31:
        return False
    if master.dtype == torch.float32 and base.dtype == torch.bfloat16:
        return _kernels() is not None
    return master.dtype == base.dtype and master.element_size() in SIGNED and _kernels() is not None


def diff(master: torch.Tensor, base: torch.Tensor, idx: torch.Tensor, val: torch.Tensor):
    """``(changed, pre, post)`` of ``master`` (its wire values) against ``base``, which it updates in place:
    the first ``changed`` entries of ``idx`` (int32) and ``val`` (the wire dtype) hold the positions and the
    new values; ``changed`` is ``-1`` when more values changed than ``idx`` holds."""
    k = _kernels()
    kernel = k["f32_bf16"] if master.dtype != base.dtype else k["same"]
    return kernel(_np(master.detach()), _np(base), idx.numpy(), _np(val), *k["nan"])


def apply_at(target: torch.Tensor, idx: torch.Tensor, val: torch.Tensor | None):
    """The checksum of ``target``'s values at ``idx``; with ``val``, written there first (the checksum then of
    the written values)."""
    k = _kernels()
    bits, at = _np(target), idx.numpy()
    return int(k["sum_at"](bits, at) if val is None else k["write_at"](bits, at, _np(val)))
