"""torch's private parts that omnigraph uses, in one place (see :mod:`omnigraph.sdk.adapters`).

- ``torch._foreach_copy_``: one multi-tensor copy (a few kernels for many tensors on a device, casting where
  dtypes differ) for weights copied in place (:func:`omnigraph.sdk.tensors.copy_into`, the transports' packs,
  the vLLM backend's direct load); the public ``Tensor.copy_`` is one kernel launch per tensor;
- ``torch.ops.mkldnn._is_mkldnn_bf16_supported``: whether oneDNN computes bf16 natively on this CPU (the
  trainer's autocast choice); no public API says it;
- ``torch.cpu._is_amx_tile_supported``: whether this CPU has AMX tiles (the condition of sgl-kernel's packed
  layout in vLLM's CPU backend, which vLLM itself tests the same way);
- ``Module._parameters``: a module's own parameters by name, a dict lookup (an export checks each parameter's
  identity there, ~0.1 ms for 290 of them, where walking ``named_parameters`` again cost ~1.8 ms);
- ``ProcessGroupNCCL.Options._timeout``: the only way to give a process group made directly (not through
  ``init_process_group``) its timeout.

>>> import torch
>>> dst, src = [torch.zeros(2), torch.zeros(3)], [torch.ones(2), torch.arange(3.0)]
>>> foreach_copy_(dst, src)
>>> [d.tolist() for d in dst]
[[1.0, 1.0], [0.0, 1.0, 2.0]]
"""

from __future__ import annotations

from datetime import timedelta

from . import check

SUPPORTED = ">=2.13,<2.14"
"""The torch versions this adapter was written for (the project pins 2.13.0)."""

_version: str | None = None


def check_version() -> str:
    """The installed torch version, checked once; :class:`~omnigraph.sdk.adapters.UnsupportedVersion` outside
    :data:`SUPPORTED`."""
    global _version
    if _version is None:
        _version = check("torch", ("torch",), SUPPORTED, __name__)
    return _version


def foreach_copy_(dst: list, src: list) -> None:
    """``dst[i].copy_(src[i])`` for all ``i`` in one multi-tensor copy (``torch._foreach_copy_``)."""
    check_version()
    import torch
    torch._foreach_copy_(dst, src)


def mkldnn_bf16_supported() -> bool:
    """Whether oneDNN has native bf16 on this CPU; False where the build cannot say."""
    check_version()
    import torch
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 - a build without the op: assume not
        return False


def amx_tile_supported() -> bool:
    """Whether this CPU has AMX tiles (``torch.cpu._is_amx_tile_supported``)."""
    check_version()
    import torch
    return bool(torch.cpu._is_amx_tile_supported())


def own_parameters(module) -> dict:
    """``module``'s own parameters by name, as the module holds them (a name may map to None): the dict
    itself, not a copy."""
    check_version()
    return module._parameters


def nccl_options(timeout: timedelta):
    """``ProcessGroupNCCL.Options`` with ``timeout`` set (a build with NCCL only)."""
    check_version()
    import torch.distributed as dist
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return opts
