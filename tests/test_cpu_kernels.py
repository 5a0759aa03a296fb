"""``omnigraph.sdk.cpu_kernels.pack_vnni``: the VNNI layout, written in place, against plain torch ops.

Needs numba (the vllm extra installs it); skipped without it. Its agreement with sgl-kernel's own packing,
and an engine computing from what it writes, are in ``tests/test_vllm.py``.
"""

import importlib.util

import pytest
import torch

from omnigraph.sdk import cpu_kernels

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed")

SHAPES = [(32, 32), (96, 64), (256, 128), (128, 384), (64, 1536)]


def test_the_kernel_compiles_where_numba_is_installed():
    assert cpu_kernels.available()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_pack_vnni_writes_the_reference_layout(dtype, threads):
    g = torch.Generator().manual_seed(0)
    src = [torch.randn(s, generator=g).to(dtype) for s in SHAPES]
    dst = [torch.full_like(w, float("nan")) for w in src]
    cpu_kernels.pack_vnni(list(zip(src, dst)), threads=threads)
    for w, p in zip(src, dst):
        assert torch.equal(p.view(torch.int16), cpu_kernels.reference_vnni(w).view(torch.int16)), tuple(w.shape)


def test_the_reference_layout_is_pairs_along_k_in_blocks_of_32_rows():
    n, k = 64, 32
    rows = torch.arange(n).view(n, 1).expand(n, k).to(torch.bfloat16)     # bf16 holds integers to 256 exactly
    cols = torch.arange(k).view(1, k).expand(n, k).to(torch.bfloat16)
    r, c = cpu_kernels.reference_vnni(rows).view(-1), cpu_kernels.reference_vnni(cols).view(-1)
    # element (block, k // 2, row in block, k % 2), flattened
    for i in (0, 1, 2, 3, 64, 65, 1023, 1024, n * k - 1):
        block, rest = divmod(i, 32 * k)
        pair, rest = divmod(rest, 64)
        b, half = divmod(rest, 2)
        assert (int(r[i]), int(c[i])) == (block * 32 + b, 2 * pair + half), i


def test_a_prefix_of_a_larger_buffer_is_written_and_the_rest_kept():
    """A vocabulary padded past the received rows: the padding's blocks stay as they were."""
    w = torch.randn(64, 64).bfloat16()
    buffer = torch.full((96, 64), 7.0, dtype=torch.bfloat16)
    cpu_kernels.pack_vnni([(w, buffer)])
    assert torch.equal(buffer[:64].reshape(-1), cpu_kernels.reference_vnni(w).reshape(-1))
    assert bool((buffer[64:] == 7.0).all())


def test_what_it_cannot_pack_is_refused_before_anything_is_written():
    dst = torch.zeros(64, 64, dtype=torch.bfloat16)
    for src, why in [(torch.randn(48, 64).bfloat16(), "blocks of 32"),         # rows not whole blocks
                     (torch.randn(64, 48).bfloat16(), "K % 32"),               # K not whole tiles
                     (torch.randn(64, 64), "16-bit"),                          # float32
                     (torch.randn(64, 128).bfloat16()[:, :64], "contiguous"),  # a strided view
                     (torch.randn(96, 64).bfloat16(), "smaller")]:             # more rows than the buffer
        with pytest.raises(ValueError, match=why):
            cpu_kernels.pack_vnni([(src, dst)])
    off = torch.zeros(64 * 64 + 16, dtype=torch.bfloat16)[8:8 + 64 * 64]      # 16 bytes off a cache line
    with pytest.raises(ValueError, match="aligned to 64 bytes"):
        cpu_kernels.pack_vnni([(torch.randn(64, 64).bfloat16(), off)])
    assert bool((dst == 0).all())
