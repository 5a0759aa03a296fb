"""Whether a full-parameter update can fit its card, known before anything starts.

The torch update keeps float32 master weights, their gradients and AdamW's two moments: 16 bytes a parameter,
whatever ``model.dtype`` (bf16 is autocast compute). That much is needed before any activation, so where it
alone exceeds what the trainer's pool has of its card, the graph cannot run, and ``omnigraph check`` says so
with the fixes (LoRA, or the state sharded over more cards) instead of a CUDA out-of-memory error minutes in.
It is a lower bound: a graph that passes may still need more (activations, allocator slack).

Where the rollout shares the trainer's card (one pool for both, or fractions of one card on one host), its part
is counted too: its weights in its dtype and the KV cache of one firing's rows (:func:`rollout_gib`), so a
colocated graph that cannot hold both is refused with each part named.

The parameters are counted from ``config.json`` for the decoder-only architectures in :data:`DENSE`
(embeddings, attention with grouped keys and values, the gated MLP, norms; tested against the models' own
counts); the card's memory is ``nvidia-smi``'s, on the machine that checks the graph.

>>> parameters({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30,
...             "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
...             "tie_word_embeddings": True})
134515008
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

DENSE = ("llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo2")


def parameters(config: dict) -> int | None:
    """The parameter count of a decoder-only model of ``config`` (None: an architecture not in :data:`DENSE`),
    or of a Qwen2.5-VL (its language model counted as Qwen2's, and its vision tower)."""
    if config.get("model_type") == "qwen2_5_vl":
        text = {**config, **config.get("text_config", {}), "model_type": "qwen2"}
        text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
        return parameters(text) + qwen25_vision(config["vision_config"])
    if config.get("model_type") not in DENSE:
        return None
    h, n, v = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    hd = config.get("head_dim") or h // heads
    bias = config["model_type"] == "qwen2" or bool(config.get("attention_bias"))
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + (heads * hd + 2 * kv * hd if bias else 0)
    if config["model_type"] in ("qwen3", "olmo2"):         # per-head (qwen3) or whole (olmo2) q/k norms
        attn += 2 * hd if config["model_type"] == "qwen3" else heads * hd + kv * hd
    mlp = 3 * h * config["intermediate_size"] + (2 * config["intermediate_size"] + h if config.get("mlp_bias") else 0)
    layer = attn + mlp + 2 * h
    head = 0 if config.get("tie_word_embeddings", False) else v * h
    return v * h + n * layer + h + head


def qwen25_vision(v: dict) -> int:
    """Qwen2.5-VL's vision tower: the patches' 3-D convolution, blocks of RMS norms, biased attention and a gated
    MLP, and the merger of ``spatial_merge_size``-squared patches into the language model's width."""
    h, inter = v["hidden_size"], v["intermediate_size"]
    patch = v.get("in_channels", 3) * v.get("temporal_patch_size", 2) * v.get("patch_size", 14) ** 2 * h
    block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * (h * inter + inter) + (inter * h + h)
    wide = h * v.get("spatial_merge_size", 2) ** 2
    merger = h + (wide * wide + wide) + (wide * v["out_hidden_size"] + v["out_hidden_size"])
    return patch + v["depth"] * block + merger


def card_gib() -> float | None:
    """The first GPU's memory in GiB, by ``nvidia-smi`` (None: no GPU or no ``nvidia-smi`` here)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.split()[0]) / 1024 if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
"""Bytes a value; ``auto`` (the checkpoint's dtype) counts as 2, the least a served model takes."""


def master_bytes(dtype: str) -> int:
    """Bytes of one trained value as the trainer holds it for ``model.dtype``: float32 masters for float32 and
    bfloat16 (autocast compute), else the checkpoint's dtype (``auto``: at least 2)."""
    return 4 if dtype in ("float32", "bfloat16") else BYTES[dtype]


def _counted(model_path: str) -> tuple[dict | None, int | None]:
    """The model folder's ``config.json`` and its parameter count (``None``: no config, or an architecture
    :func:`parameters` does not count)."""
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else None
        return config, (parameters(config) if config else None)
    except (ValueError, KeyError, TypeError):
        return None, None


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    """Keys and values of one token over every layer of a decoder of ``config`` (its language model's)."""
    t = {**config, **config.get("text_config", {})}
    heads = t["num_attention_heads"]
    hd = t.get("head_dim") or t["hidden_size"] // heads
    return 2 * t["num_hidden_layers"] * (t.get("num_key_value_heads") or heads) * hd * BYTES[dtype]


def rollout_gib(model_path: str, dtype: str, rows: int, tokens: int) -> float | None:
    """A rollout actor's weights in ``dtype`` and the KV cache of ``rows`` sequences of ``tokens``, in GiB (None:
    an architecture :func:`parameters` does not count)."""
    config, n = _counted(model_path)
    try:
        return None if n is None else (n * BYTES[dtype] + rows * tokens * kv_bytes_per_token(config, dtype)) / 2 ** 30
    except (KeyError, TypeError):
        return None


def lora_state_gib(model_path: str, dtype: str) -> float | None:
    """A LoRA update's frozen base weights as the trainer holds them (:func:`master_bytes` a parameter)."""
    _, n = _counted(model_path)
    return None if n is None else n * master_bytes(dtype) / 2 ** 30


def update_state_gib(model_path: str, freeze=(), dtype: str = "bfloat16") -> float | None:
    """The full-parameter update's weights, gradients and AdamW's two moments in GiB, four values of
    :func:`master_bytes` a parameter (16 bytes with float32 masters), for a model folder whose architecture
    :func:`parameters` counts (None otherwise: an alias, another architecture). A frozen vision tower
    (``freeze``: ``model.freeze``) keeps only its weights."""
    config, n = _counted(model_path)
    if n is None:
        return None
    frozen = qwen25_vision(config["vision_config"]) if "vision" in freeze and \
        config.get("model_type") == "qwen2_5_vl" else 0
    value = master_bytes(dtype)
    return ((n - frozen) * 4 * value + frozen * value) / 2 ** 30
