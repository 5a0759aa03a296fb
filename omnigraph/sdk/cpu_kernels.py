"""A weight into the layout AMX kernels compute with, at memory speed: :func:`pack_vnni`.

vLLM's CPU backend multiplies by weights repacked for AMX. sgl-kernel's layout (its kernels for small layers,
and for every layer when omnigraph's vLLM backend fills the engine's weights) holds a ``[N, K]``
16-bit weight as pairs along ``K`` (32-bit words), in blocks of 32 rows, each block ``[K / 2, 32]`` words: a
transpose of the block seen as ``[32, K / 2]`` words (:func:`reference_vnni`). vLLM makes it, or oneDNN's
blocked layout, into a new buffer per layer at each load, at about half a plain copy's speed (oneDNN: plus
0.13-0.15 ms per layer). :func:`pack_vnni` writes it into buffers that stay put: 16 x 16 tiles of words
transposed in vector registers (four rounds of two-vector shuffles), each row of a tile stored as one whole
cache line past the cache (non-temporal: ordinary stores read each destination line before writing it, 25%
slower here), one contiguous share of the blocks per CPU this process may use.

The kernel is LLVM vector code compiled at first use by numba (which vLLM's CPU build requires) and checked
then against :func:`reference_vnni`; where numba is missing, llvmlite is outside the versions of its adapter
(:mod:`omnigraph.sdk.adapters.llvmlite`), or the kernel fails to compile or to match, :func:`available` is False
and callers keep vLLM's repack. On a 2-core Xeon (Sapphire Rapids), for
SmolLM2-135M's 269 MB: 17-19 ms, against 21 ms for a plain copy of the same bytes (``torch``) and 47 ms for
sgl-kernel's own repack into new buffers.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .adapters import llvmlite as llvmlite_adapter

BLOCK = 32
"""Rows per block of the VNNI layout."""
TILE = 16
"""Side of the square tiles of 32-bit words transposed in registers: one 64-byte cache line per row."""
LINE = 64
"""Bytes per cache line: destinations are written in whole, aligned lines."""

_KERNELS: dict = {}
_LOCK = threading.Lock()
_POOLS: dict[int, ThreadPoolExecutor] = {}


def available() -> bool:
    """True where the kernels compile (numba installed and working)."""
    return _kernels() is not None


def vnni_fits(n: int, k: int, dtype: torch.dtype) -> bool:
    """Shapes and dtypes :func:`pack_vnni` packs: 16-bit floats, whole blocks of rows, ``K % 32 == 0`` (whole
    tiles; sgl-kernel asks the same)."""
    return dtype in (torch.bfloat16, torch.float16) and n > 0 and n % BLOCK == 0 and k % (2 * TILE) == 0


def reference_vnni(w: torch.Tensor) -> torch.Tensor:
    """The VNNI layout of ``w`` ``[N, K]`` by plain torch ops (slow; for checks), as a new ``[N, K]`` tensor."""
    n, k = w.shape
    words = w.contiguous().view(torch.int32).view(n // BLOCK, BLOCK, k // 2)
    return words.transpose(1, 2).contiguous().view(w.dtype).view(n, k)


def pack_vnni(pairs: list[tuple[torch.Tensor, torch.Tensor]], threads: int | None = None) -> None:
    """Pack each ``(src, dst)``: ``src`` a contiguous ``[N, K]`` weight (:func:`vnni_fits`), ``dst`` a contiguous
    buffer of its dtype, at least its size, aligned to a cache line; its first ``N * K`` elements are written
    (rows past ``N``, a vocabulary's padding, stay as they were)."""
    for src, dst in pairs:
        why = _unpackable(src, dst)
        if why:
            raise ValueError(f"cannot pack a {tuple(src.shape)} {src.dtype} weight into a {tuple(dst.shape)} "
                             f"{dst.dtype} buffer: {why}")
    if not available():
        raise RuntimeError("pack_vnni needs numba (pip install numba; vLLM's CPU build installs it)")
    work = [(s.data_ptr(), d.data_ptr(), s.shape[1] // 2, s.shape[0] // BLOCK) for s, d in pairs]
    _run(work, threads)


def _unpackable(src: torch.Tensor, dst: torch.Tensor) -> str | None:
    """Why ``src`` cannot be packed into ``dst``, or None."""
    if src.dim() != 2:
        return "the weight must be [N, K]"
    n, k = src.shape
    if src.dtype not in (torch.bfloat16, torch.float16) or dst.dtype != src.dtype:
        return "both must have one 16-bit float dtype"
    if n % BLOCK or k % (2 * TILE):
        return f"rows must come in blocks of {BLOCK} and K % {2 * TILE} == 0"
    if not all(t.device.type == "cpu" and t.is_contiguous() for t in (src, dst)):
        return "both must be contiguous CPU tensors"
    if dst.numel() < src.numel():
        return "the buffer is smaller than the weight"
    if dst.data_ptr() % LINE:
        return f"the buffer must be aligned to {LINE} bytes (whole cache lines)"
    return None


def _run(work: list[tuple[int, int, int, int]], threads: int | None) -> None:
    """Split ``work`` (source, destination, words per row, blocks) into contiguous shares of about equal
    blocks, one per thread, and run the kernel on each (numba releases the GIL)."""
    kernel = _kernels()["vnni"]
    threads = threads or len(os.sched_getaffinity(0))
    total = sum(blocks for *_, blocks in work)
    share = -(-total // threads) if total else 1
    tables, rows, room = [], [], share
    for src, dst, words, blocks in work:
        first = 0
        while first < blocks:
            take = min(room, blocks - first)
            rows.append((src, dst, words, first, first + take))
            first, room = first + take, room - take
            if room == 0:
                tables.append(rows)
                rows, room = [], share
    if rows:
        tables.append(rows)
    tables = [np.array(t, dtype=np.int64).reshape(-1, 5) for t in tables]
    if len(tables) == 1:
        kernel(tables[0])
        return
    pool = _POOLS.get(threads)
    if pool is None:
        pool = _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="omnigraph-cpu-kernels")
    list(pool.map(kernel, tables))


def _kernels() -> dict | None:
    with _LOCK:
        if "kernels" not in _KERNELS:
            try:
                kernels = _compile()
                w = torch.randn(BLOCK, 2 * TILE, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
                out = torch.empty(w.numel() + LINE, dtype=torch.bfloat16)
                out = out[(-out.data_ptr() % LINE) // 2:][:w.numel()]       # a cache line's start
                kernels["vnni"](np.array([[w.data_ptr(), out.data_ptr(), TILE, 0, 1]], dtype=np.int64))
                ok = torch.equal(out.view(torch.int16), reference_vnni(w).view(torch.int16).reshape(-1))
                _KERNELS["kernels"] = kernels if ok else None
            except Exception:                        # noqa: BLE001 - no numba, or a kernel that fails: vLLM's repack
                _KERNELS["kernels"] = None
        return _KERNELS["kernels"]


def _compile() -> dict:
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    # a vLLM engine started later in this process would trip over llvmlite's library handle (see the adapter)
    llvmlite_adapter.give_lib_a_dict()

    i32, i64 = ir.IntType(32), ir.IntType(64)
    words = ir.VectorType(i32, TILE)

    def address(builder, base, stride, i, kind):
        at = builder.add(base, builder.mul(stride, ir.Constant(i64, i)))
        return builder.inttoptr(at, kind.as_pointer())

    def stream(builder, value, pointer):
        """A store of one whole cache line past the cache (non-temporal)."""
        hint = builder.module.add_metadata([ir.Constant(i32, 1)])
        builder.store(value, pointer, align=LINE).set_metadata("nontemporal", hint)

    @intrinsic
    def tile(typingctx, src, src_stride, dst, dst_stride):
        """dst[j][i] = src[i][j] for a TILE x TILE tile of 32-bit words; rows ``*_stride`` bytes apart. Each round
        b = 1, 2, 4, 8 swaps the off-diagonal b-wide blocks of rows i and i + b (two shuffles per pair)."""
        def codegen(context, builder, signature, args):
            s, ss, d, ds = args
            rows = [builder.load(address(builder, s, ss, i, words), align=4) for i in range(TILE)]
            b = 1
            while b < TILE:
                keep = ir.Constant(words, [c if c & b == 0 else TILE + c - b for c in range(TILE)])
                swap = ir.Constant(words, [c + b if c & b == 0 else TILE + c for c in range(TILE)])
                for i in range(TILE):
                    if i & b == 0:
                        x, y = rows[i], rows[i + b]
                        rows[i], rows[i + b] = builder.shuffle_vector(x, y, keep), builder.shuffle_vector(x, y, swap)
                b *= 2
            for j in range(TILE):
                stream(builder, rows[j], address(builder, d, ds, j, words))
            return context.get_dummy_value()
        return types.void(types.int64, types.int64, types.int64, types.int64), codegen

    @intrinsic
    def fence(typingctx):
        """Order this thread's non-temporal stores before what it does next (x86: MFENCE)."""
        def codegen(context, builder, signature, args):
            builder.fence("seq_cst")
            return context.get_dummy_value()
        return types.void(), codegen

    @njit(nogil=True, cache=True)
    def vnni(table):
        """Rows of ``table``: source, destination, words per row (K / 2), first and end block of 32 rows."""
        for j in range(table.shape[0]):
            src, dst, k2, first, end = table[j, 0], table[j, 1], table[j, 2], table[j, 3], table[j, 4]
            for blk in range(first, end):
                base = blk * BLOCK * k2 * 4
                for k0 in range(0, k2, TILE):
                    for b0 in range(0, BLOCK, TILE):
                        tile(src + base + (b0 * k2 + k0) * 4, k2 * 4, dst + base + (k0 * BLOCK + b0) * 4, BLOCK * 4)
        fence()

    return {"vnni": vnni}
