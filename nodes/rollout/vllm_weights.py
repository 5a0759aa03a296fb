"""New weights into a live vLLM engine, in place: the worker extension :class:`WeightLoader`.

``LLM(worker_extension_cls="nodes.rollout.vllm_weights.WeightLoader")`` makes its methods methods of each vLLM
worker; the ``vllm`` generate backend calls them with ``llm.collective_rpc``.

On vLLM's CPU backend a linear layer does not keep its weight: after loading, the weight is repacked
into a oneDNN (or sgl-kernel) blocked layout held by the layer's ``cpu_linear`` and ``layer.weight``
is left empty, so the model's ``load_weights`` cannot write into it. Three ways in:

- ``reload``: vLLM's ``reload_weights``, which rebuilds every layer's parameters from the tensors
  given and processes them again (0.41 s for SmolLM2-135M here, 269 MB in bf16);
- ``in place`` (every load after the first): the first load goes through ``reload_weights`` and keeps
  each repacked layer's checkpoint-format parameter (the one its weight loader writes into, fused
  q/k/v and gate/up included); later loads put those parameters back, let the model's own
  ``load_weights`` copy the received tensors into them and into the embeddings and norms (which keep
  their layout: a plain copy), and repack only the linear layers. No parameter is allocated, nothing
  is rebuilt; the repack is the one pass that cannot be avoided while vLLM computes with packed weights
  (it generated 9-28% faster with them than with plain ``F.linear`` weights on this CPU).

- ``direct`` (every load after the first, where it could be proven): each repacked layer is repacked
  straight from the received tensors, with no copy before it. The first load learns, for each such layer,
  which received tensors its checkpoint-format weight is made of, in which order (the model's
  ``packed_modules_mapping``: ``qkv_proj`` from ``q_proj``, ``k_proj``, ``v_proj``), and checks it: the
  concatenation must equal what vLLM's own loader wrote; every other parameter must be one received tensor
  of its own name and value, and every received tensor must be used. Where the received tensors of a fused
  layer lie one after the other in one buffer (a :class:`~omnigraph.transports.pack.TensorPack` packed in the
  trainer's order, as the ``shm`` path delivers it), the repack reads that span of the mapped file as it is;
  otherwise they are concatenated first. One thread repacks (two took as long here, and the OpenMP
  teams they leave spinning slowed the trainer's next export by 2x).
  The checkpoint-format copies the ``in place`` path keeps are then freed (the model's linear weights once
  more in RAM). Anything the check cannot prove keeps the ``in place`` path.

  Where asked (the generate node's ``options: {packed_weights: true}``; off by default: with it on, a
  bf16 SmolLM2-135M run on an AMX CPU went from learning to collapse while the sampler's log-probs of its own
  tokens drifted by 3-13 nats from the trainer's, a fault not found yet), on a CPU with AMX, for 16-bit
  weights, the direct path goes further: the linear layers, and the output
  head (from the received embeddings where it is tied), compute from buffers of sgl-kernel's packed layout
  that the plan owns, and each load refills them in place (:func:`omnigraph.sdk.cpu_kernels.pack_vnni`,
  faster than a plain copy here) where vLLM would pack into new oneDNN buffers at half a copy's speed plus
  0.13-0.15 ms per layer (SmolLM2-135M in bf16: the engine's load 85 -> 24 ms). sgl-kernel is vLLM's own
  kernel for its small layers; for the large ones it picks oneDNN, which generated at the same speed here
  (``bench/vllm_layout.py``, SmolLM2-135M on 2 cores: x1.01 the tokens/s at 32 sequences, x0.98 at 128). A
  layer moves only where the repacker's output equals sgl-kernel's own packing of the loaded weight (checked
  once).

A tied output head is tied to the embeddings again and, unless the direct path packs it, re-processed
(``reload_weights`` replaces the embedding's parameter; without the re-tie logprobs were off by up to ~1.0).

vLLM's internals all this reaches (the worker's model, configuration and ``reload_weights``, the CPU repack and
its watch, sgl-kernel's ops) go through :mod:`omnigraph.sdk.adapters.vllm`, torch's through
:mod:`omnigraph.sdk.adapters.torch`: each checked against the versions it was written for.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load, load_file, save_file

from omnigraph.sdk import cpu_kernels
from omnigraph.sdk.adapters import torch as torch_adapter
from omnigraph.sdk.adapters import vllm as vllm_adapter

log = logging.getLogger(__name__)


def shm_dir() -> Path:
    """A RAM-backed folder for weight hand-overs: ``/dev/shm`` where there is one."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    d = base / f"omnigraph-vllm-{os.getpid()}"
    if not d.exists():
        d.mkdir(parents=True)
        atexit.register(shutil.rmtree, d, True)     # RAM: never leave it behind
    return d


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> int:
    """Write ``tensors`` as one safetensors file (atomically); returns its size in bytes.

    ``save_file`` writes straight to the file: into ``/dev/shm`` as fast as a memcpy
    (2.6 GB/s here), where ``save`` (to bytes) and then writing took 4.5x as long."""
    tmp = path.with_suffix(".tmp")
    seen, out = set(), {}
    for k, v in tensors.items():            # a tied weight once (the loader re-ties the head)
        key = (v.data_ptr(), tuple(v.shape))
        if key not in seen:
            seen.add(key)
            out[k] = v.detach().contiguous()
    save_file(out, str(tmp))
    os.replace(tmp, path)
    return path.stat().st_size


def _keeping_packed_params(kept: dict):
    """While vLLM processes freshly loaded weights (the block), remember each layer whose weight it repacks,
    with the checkpoint-format parameter it repacks from (``kept[layer] = parameter``); vLLM's repack is its
    own again when the block ends (:func:`omnigraph.sdk.adapters.vllm.watching_repacks`)."""
    def keep(layer, remove_weight):
        if remove_weight and layer.weight.numel():
            kept[layer] = layer.weight

    return vllm_adapter.watching_repacks(keep)


class WeightLoader:
    """vLLM worker extension: ``omnigraph_load_weights`` (see the module docstring)."""

    def omnigraph_load_weights(self, source, packed: bool = False) -> dict:
        """Load a full set of weights from a safetensors file path, safetensors bytes, or (in-process engine
        only) a mapping of tensors; returns what it took (``how``: ``reload``, ``in place`` or ``direct``; ``packed``:
        the layers it refilled in sgl-kernel's layout, which it tries only where ``packed`` is asked) and timings."""
        t0 = time.perf_counter()
        if isinstance(source, (str, os.PathLike)):
            tensors = load_file(str(source))
        elif isinstance(source, (bytes, bytearray, memoryview)):
            tensors = load(bytes(source))
        else:
            tensors = source
        t1 = time.perf_counter()
        model = vllm_adapter.worker_model(self)
        self._omnigraph_check_complete(tensors)
        kept = getattr(self, "_omnigraph_packed", None)
        direct = getattr(self, "_omnigraph_direct", None)
        if direct is not None and direct.load(tensors):
            how = "direct"
            self._omnigraph_retie(model, process=not direct.head)    # else the plan packed the head
        elif kept is not None and self._omnigraph_in_place(model, tensors, kept):
            how = "in place"
            self._omnigraph_retie(model)
        else:
            how = "reload"
            kept = {} if self._omnigraph_can_keep() else None
            with _keeping_packed_params(kept) if kept is not None else contextlib.nullcontext():
                vllm_adapter.reload_weights(self, tensors)
            self._omnigraph_retie(model)
            self._omnigraph_packed = kept
            self._omnigraph_direct = Direct.learn(model, tensors, kept, self._omnigraph_tied(),
                                                  packed=packed) if kept else None
            if self._omnigraph_direct is not None:
                self._omnigraph_packed = None        # the direct path needs no checkpoint-format copies
        packed = len(self._omnigraph_direct.packed) if how == "direct" else 0
        return {"how": how, "packed": packed, "decode_s": t1 - t0, "load_s": time.perf_counter() - t1}

    def _omnigraph_check_complete(self, tensors) -> None:
        """Refuse a payload that lacks a tensor the engine's checkpoint has (before anything is written): a
        missing layer would keep serving its old weights, in place or through ``reload_weights``."""
        expected = getattr(self, "_omnigraph_expected", None)
        if expected is None:
            expected = _checkpoint_names(vllm_adapter.worker_config(self).model_config.model)
            # no safetensors in the model folder: the first load names the full set
            self._omnigraph_expected = expected = set(tensors) if expected is None else expected
        tied = self._omnigraph_tied()
        missing = sorted(n for n in expected - set(tensors) if not (tied and n.startswith("lm_head.")))
        if missing:
            shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            raise ValueError(f"the weights sent to vLLM lack {len(missing)} of the model's {len(expected)} tensors "
                             f"({shown}): a full sync sends every parameter; the engine kept its weights")

    def _omnigraph_can_keep(self) -> bool:
        """In place needs the CPU backend's repack and a model without LoRA layers (their wrapped weights
        are loaded by name through ``base_layer``: those go through ``reload_weights`` every time)."""
        from vllm.platforms import current_platform
        return current_platform.is_cpu() and not vllm_adapter.worker_config(self).lora_config

    def _omnigraph_in_place(self, model, tensors, kept: dict) -> bool:
        """Put the kept parameters back, let the model's loader copy ``tensors`` into them, repack."""
        names = {n for n, _ in model.named_parameters()}
        restored = {}
        for layer, param in kept.items():
            restored[layer] = layer.weight
            layer.weight = param
        try:
            loaded = model.load_weights(iter(tensors.items()))
        except Exception:                        # a name or shape this path does not know: reload instead
            for layer, empty in restored.items():
                layer.weight = empty
            return False
        if loaded is not None and not (names - _tied(model)) <= set(loaded):
            for layer in kept:                   # a parameter nothing wrote: reload, never serve stale weights
                vllm_adapter.repack(layer)
            return False
        for layer in kept:
            vllm_adapter.repack(layer)
        return True

    def _omnigraph_retie(self, model, process: bool = True) -> None:
        """The output head after new weights: tied to the embeddings again where the model ties them, and
        processed again (on CPU its weight is also held in a blocked copy made from it) unless ``process`` is
        False: the direct path packed it."""
        head = _head(model)
        if head is None:
            return
        if self._omnigraph_tied():
            head.weight = _embedding(model).weight
        if process:
            vllm_adapter.process_after_loading(head)

    def _omnigraph_tied(self) -> bool:
        config = vllm_adapter.worker_config(self).model_config.hf_text_config
        return bool(getattr(config, "tie_word_embeddings", False))


class Direct:
    """The ``direct`` path (module docstring): how each parameter of the engine is made from the received
    tensors, learned and checked on a load that went through vLLM's loader."""

    def __init__(self, linear: list, plain: list, names: dict[str, tuple[int, ...]], packed: list | None = None,
                 head: bool = False):
        self.linear = linear        # (layer, weight source names, bias source names or None, dtype)
        self.plain = plain          # (parameter, source name)
        self.names = names          # every received name it uses -> its shape
        # (layer, weight source names, bias source names or None, buffer): layers that compute from a buffer of
        # sgl-kernel's layout the plan refills (cpu_kernels.pack_vnni); ``head``: the output head is among them
        self.packed = packed or []
        self.head = head

    @classmethod
    @torch.no_grad()
    def learn(cls, model, tensors, kept: dict, tied: bool, packed: bool = False) -> "Direct | None":
        """The plan for ``model`` right after ``tensors`` were loaded into it (``kept``: each repacked layer's
        checkpoint-format weight; ``tied``: the output head shares the embeddings; ``packed``: try sgl-kernel's
        refilled layout), or None where any part of it does not check out."""
        mapping = getattr(model, "packed_modules_mapping", None) or {}
        module_names = {m: n for n, m in model.named_modules()}
        # a tied model's loader skips a received head (the head is the embeddings): so does the plan
        tied = _tied(model) | {n for n in tensors if n.startswith("lm_head.")} if tied else set()
        linear, covered = [], set()
        used: dict[str, tuple[int, ...]] = {}
        for layer, weight in kept.items():
            name = module_names.get(layer)
            if name is None or "." not in name:
                return _unproven(f"layer {name!r} is not a named submodule")
            prefix, short = name.rsplit(".", 1)
            parts = [f"{prefix}.{p}" for p in mapping.get(short, [short])]
            srcs = [f"{p}.weight" for p in parts]
            if not all(n in tensors for n in srcs) or \
                    not torch.equal(weight, torch.cat([tensors[n] for n in srcs]).to(weight.dtype)):
                return _unproven(f"{name}: its weight is not the concatenation of {srcs}")
            bias = None
            if getattr(layer, "bias", None) is not None:
                bias = [f"{p}.bias" for p in parts]
                if not all(n in tensors for n in bias) or \
                        not torch.equal(layer.bias, torch.cat([tensors[n] for n in bias]).to(layer.bias.dtype)):
                    return _unproven(f"{name}: its bias is not the concatenation of {bias}")
                covered.add(f"{name}.bias")
            linear.append((layer, srcs, bias, weight.dtype))
            covered.add(f"{name}.weight")
            used |= {n: tuple(tensors[n].shape) for n in srcs + (bias or [])}
        plain = []
        for name, param in model.named_parameters():
            if name in covered or name in tied:
                continue
            src = tensors.get(name)
            # vLLM pads the vocabulary of its embeddings: the received rows go first, the padding stays
            if src is None or src.dim() != param.dim() or src.shape[1:] != param.shape[1:] or \
                    src.shape[0] > param.shape[0] or not torch.equal(param[:src.shape[0]], src.to(param.dtype)):
                return _unproven(f"parameter {name!r} is not the received tensor of its name")
            plain.append((param[:src.shape[0]], name))
            used[name] = tuple(src.shape)
        if set(tensors) - set(used) - tied:       # a received tensor the plan would drop
            return _unproven(f"received tensors it would not use: {sorted(set(tensors) - set(used) - tied)[:3]}")
        moved, head = [], False
        if packed:
            linear, moved, head = _to_packed(model, linear, kept, tensors, tied)
        return cls(linear, plain, used, moved, head)

    @torch.no_grad()
    def load(self, tensors) -> bool:
        """Write ``tensors`` into the engine by the plan; False (nothing written) when they do not fit it."""
        if any(tuple(tensors[n].shape) != s if n in tensors else True for n, s in self.names.items()):
            return False
        dst = [p for p, _ in self.plain]
        torch_adapter.foreach_copy_(dst, [tensors[n] for _, n in self.plain])
        for layer, srcs, bias, dtype in self.linear:
            _repack(layer, _joined([tensors[n] for n in srcs], dtype),
                    None if bias is None else torch.cat([tensors[n] for n in bias]))
        if self.packed:
            pairs = []
            for layer, srcs, bias, buffer in self.packed:
                pairs.append((_joined([tensors[n] for n in srcs], buffer.dtype).contiguous(), buffer))
                if bias is not None:
                    layer.bias.copy_(torch.cat([tensors[n] for n in bias]))
            cpu_kernels.pack_vnni(pairs)
        return True


def _to_packed(model, linear: list, kept: dict, tensors, tied: set) -> tuple[list, list, bool]:
    """Move the layers of ``linear`` (and the output head) onto buffers of sgl-kernel's layout, which
    :func:`~omnigraph.sdk.cpu_kernels.pack_vnni` refills at each load: ``(linear, packed, head)``, the layers
    left to vLLM's repack, those moved, and whether the head is among them (``tied``: the names a tied head
    shares; its source is then the received embeddings). Only on a CPU with AMX (sgl-kernel's condition), for
    16-bit weights whose shapes fit, and each layer only where the repacker's output equals sgl-kernel's own
    packing of the weight vLLM loaded (checked here, once)."""
    if not (torch_adapter.amx_tile_supported() and vllm_adapter.has_packed_kernels()):
        return linear, [], False
    if not cpu_kernels.available():
        log.info("vLLM weights: the packing kernel did not compile (numba); vLLM repacks every load")
        return linear, [], False

    def move(layer, weight, rows):
        """A buffer of sgl-kernel's layout for ``layer`` made from ``weight`` (its first ``rows`` rows are
        refilled at each load), or None where the repacker does not reproduce sgl-kernel's packing."""
        n, k = weight.shape
        if not (cpu_kernels.vnni_fits(n, k, weight.dtype) and rows % cpu_kernels.BLOCK == 0):
            return None
        buffer = vllm_adapter.convert_weight_packed(weight)
        if buffer.dtype != weight.dtype or buffer.numel() != weight.numel() or buffer.data_ptr() % cpu_kernels.LINE:
            return None
        check = torch.empty_like(buffer)
        cpu_kernels.pack_vnni([(weight[:rows].contiguous(), check)])
        if not torch.equal(check.reshape(-1)[:rows * k], buffer.reshape(-1)[:rows * k]):
            return None
        buffer = buffer.reshape(n, k)
        if getattr(layer, "bias", None) is not None:
            layer.bias.data = layer.bias.to(torch.float32)      # as vLLM's sgl-kernel dispatch does
        vllm_adapter.compute_from_packed(layer, buffer, n)
        return buffer

    left, packed = [], []
    for layer, srcs, bias, dtype in linear:
        buffer = move(layer, kept[layer], kept[layer].shape[0])
        if buffer is None:
            left.append((layer, srcs, bias, dtype))
        else:
            packed.append((layer, srcs, bias, buffer))
    head, moved = _head(model), False
    if head is not None and getattr(head, "bias", None) is None and head.weight.dim() == 2:
        src = _name_of(model, _embedding(model).weight) if tied else _name_of(model, head.weight)
        if src in tensors and tensors[src].dim() == 2:
            buffer = move(head, head.weight.detach(), tensors[src].shape[0])
            if buffer is not None:
                packed.append((head, [src], None, buffer))
                moved = True
    if packed:
        log.info("vLLM weights: %d of %d layers computed from sgl-kernel's layout, repacked in place at each load",
                 len(packed), len(linear) + (head is not None))
    return left, packed, moved


def _head(model):
    head = getattr(model, "lm_head", None)
    return None if head is None else getattr(head, "base_layer", head)


def _embedding(model):
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else model.model.embed_tokens
    return getattr(embed, "base_layer", embed)


def _name_of(model, param) -> str | None:
    return next((n for n, p in model.named_parameters(remove_duplicate=False) if p is param), None)


def _unproven(reason: str) -> None:
    log.info("vLLM weights: the direct path is not used (%s); later loads go in place", reason)
    return None


def _joined(parts: list, dtype) -> torch.Tensor:
    """The row-wise concatenation of ``parts`` in ``dtype``: a view where they lie one after the other in one
    buffer (a received pack), else a new tensor."""
    first = parts[0]
    step = first.element_size()
    adjacent = all(p.dtype == dtype and p.is_contiguous() and p.dim() == 2 and p.shape[1] == first.shape[1]
                   for p in parts) and all(
        b.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        and b.data_ptr() == a.data_ptr() + a.numel() * step for a, b in zip(parts, parts[1:]))
    if not adjacent:
        return torch.cat(parts).to(dtype)
    rows = sum(p.shape[0] for p in parts)
    return torch.empty(0, dtype=dtype).set_(first.untyped_storage(), first.storage_offset(), (rows, first.shape[1]))


def _repack(layer, weight: torch.Tensor, bias) -> None:
    """Repack ``layer`` from ``weight`` (vLLM's CPU dispatch copies it into its own blocked layout and leaves
    ``layer.weight`` empty again)."""
    if bias is not None:
        layer.bias.copy_(bias)
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    vllm_adapter.repack(layer)


def _tied(model) -> set[str]:
    """Parameter names a tied model never loads by name (the output head shares the embeddings)."""
    return {n for n, _ in model.named_parameters() if n.startswith("lm_head.")}


def _checkpoint_names(model_path: str) -> set[str] | None:
    """The tensor names in a local checkpoint's safetensors files (headers only), or None."""
    from safetensors import safe_open
    files = sorted(Path(model_path).glob("*.safetensors")) if Path(model_path).is_dir() else []
    if not files:
        return None
    names = set()
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            names.update(sf.keys())
    return names
