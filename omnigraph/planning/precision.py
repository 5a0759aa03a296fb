"""``model.dtype: auto`` (the default): bfloat16 where the hardware runs it natively, float32 elsewhere.

Native bf16 is a CUDA GPU with bf16 arithmetic (``torch.cuda.is_bf16_supported(including_emulation=False)``:
compute capability 8.0 and newer), or a CPU whose ``/proc/cpuinfo`` flags include ``amx_bf16`` or
``avx512_bf16``. Elsewhere bf16 is emulated and slower than float32 (SmolLM2-135M in vLLM on an Ice Lake
CPU without AMX: 101 tok/s in bf16, 296 tok/s in float32).

It is decided per pool, where the pool runs, once per run:

- a CPU pool of this machine (no ``runtime.address``: the local executor or a local Ray cluster) when
  the graph is compiled, from this machine's ``/proc/cpuinfo``;
- a GPU pool, or any pool of a remote cluster, on the pool's actors as they start (``torch`` answers
  there); each actor prints what it chose.

``print(plan)`` (``omnigraph check``, ``plan.txt``) says which, for every pool that runs the model. An
explicit ``model.dtype`` is used as written, everywhere.

>>> resolve("auto", "cpu", flags={"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
Precision(asked='auto', dtype='bfloat16', why='CPU has amx_bf16')
>>> resolve("auto", "cpu", flags={"avx2", "avx512f"})
Precision(asked='auto', dtype='float32', why='CPU without AMX or AVX512-BF16')
>>> resolve("auto", "cuda", cuda=lambda: (False, "Tesla T4"))
Precision(asked='auto', dtype='float32', why='CUDA GPU Tesla T4 without native bf16')
>>> resolve("auto", "cuda", decide_here=False)
Precision(asked='auto', dtype=None, why="decided on the pool's GPU as it starts (bfloat16 if native, else float32)")
>>> resolve("float32", "cuda")
Precision(asked='float32', dtype='float32', why='as written')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""``/proc/cpuinfo`` flags of a CPU that runs bf16 natively (AMX tiles, AVX512-BF16 dot products)."""


@dataclass(frozen=True)
class Precision:
    """What ``model.dtype`` became on one pool."""

    asked: str
    """``model.dtype`` as written: ``auto``, ``float32``, ``bfloat16`` or ``float16``."""
    dtype: str | None
    """The dtype the pool's nodes get (``ctx.model.dtype``); None: decided on the actors as they start."""
    why: str

    def line(self, pool: str) -> str:
        """The plan's line: ``auto -> bfloat16 on pool trainer (CPU has amx_bf16)``."""
        if self.dtype is None:
            return f"{self.asked} on pool {pool}: {self.why}"
        return f"{self.asked} -> {self.dtype} on pool {pool} ({self.why})"


def cpu_flags(path: str | Path = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's feature flags (the first ``flags`` line of ``/proc/cpuinfo``); None where there is none."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return None


def _cuda() -> tuple[bool, str]:
    import torch
    name = torch.cuda.get_device_name()
    return bool(torch.cuda.is_bf16_supported(including_emulation=False)), name


def resolve(asked: str, device: str, *, flags: set[str] | None = None,
            cuda: Callable[[], tuple[bool, str]] | None = None, decide_here: bool = True) -> Precision:
    """``asked`` (``model.dtype``) on a pool whose nodes run on ``device`` (``cpu`` or ``cuda``).

    ``flags``: the CPU's flags (default: this machine's); ``cuda()``: (native bf16?, device name) of the GPU
    this process uses; ``decide_here``: False when this process cannot see the pool's hardware (the answer
    is then left to the actors, ``dtype=None``)."""
    if asked != "auto":
        return Precision(asked, asked, "as written")
    if not decide_here:
        where = "GPU" if device == "cuda" else "CPU"
        return Precision(asked, None, f"decided on the pool's {where} as it starts (bfloat16 if native, else float32)")
    if device == "cuda":
        native, name = (cuda or _cuda)()
        if native:
            return Precision(asked, "bfloat16", f"CUDA GPU {name} has native bf16")
        return Precision(asked, "float32", f"CUDA GPU {name} without native bf16")
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return Precision(asked, "float32", "CPU flags unknown (no /proc/cpuinfo)")
    for flag in CPU_FLAGS:
        if flag in flags:
            return Precision(asked, "bfloat16", f"CPU has {flag}")
    return Precision(asked, "float32", "CPU without AMX or AVX512-BF16")
