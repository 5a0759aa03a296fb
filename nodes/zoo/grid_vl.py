"""A Qwen2.5-VL (or Qwen2-VL) model of any shape with random weights: the patch-grid image-text model of the
tests (tiny) and of the GPU benchmark's image-text shape (Qwen2.5-VL-3B's configuration).

It is ``Qwen2_5_VLForConditionalGeneration`` (``Qwen2VLForConditionalGeneration``) as transformers ships it, saved with what a Qwen2.5-VL checkpoint
carries (``config.json``, the image processor's ``preprocessor_config.json``, the tokenizer and a chat
template), so it loads exactly as a user's does, through :class:`nodes.models.patch_grid.GridProcessor`. The
tokenizer is the embedded model's characters plus Qwen's vision tokens, padded to the configuration's
vocabulary. Random weights teach nothing: this model is for measuring and for checking that the rollout and the
trainer read the same positions, never for learning.
"""

from __future__ import annotations

from pathlib import Path

from nodes.zoo.tiny import build_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CHAT = ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for p in m['content'] %}{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
        "{% if m['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}")
"""Qwen's picture markup without its role markers (the character tokenizer has no ``<|im_start|>``)."""

TINY_TEXT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                 initializer_range=0.2)     # sharp attention: a wrong position shows in the log-probs
TINY_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                   fullatt_block_indexes=[1])
TINY_VISION_QWEN2 = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
"""Qwen2-VL's tower (``arch="qwen2_vl"``): its fields differ from Qwen2.5-VL's."""
QWEN25_VL_3B_TEXT = dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                         intermediate_size=11008, vocab_size=151936, max_position_embeddings=128000,
                         rope_theta=1e6, tie_word_embeddings=True,
                         rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})
QWEN25_VL_3B_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                           fullatt_block_indexes=[7, 15, 23, 31], window_size=112, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2)
"""Qwen2.5-VL-3B-Instruct's configuration (its ``config.json``)."""


def tokenizer(vocab_size: int | None = None):
    """The character tokenizer with Qwen's vision tokens, padded with unused tokens to ``vocab_size``."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    if vocab_size is not None and vocab_size > len(tok):
        tok.add_tokens([f"<x{i}>" for i in range(len(tok), vocab_size)])
    tok.chat_template = CHAT
    return tok


def build(target: Path, text: dict = TINY_TEXT, vision: dict = TINY_VISION, seed: int = 0,
          device: str = "cpu", dtype=None, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280,
          arch: str = "qwen2_5_vl") -> Path:
    """Save a random Qwen2.5-VL (``arch="qwen2_vl"``: Qwen2-VL) of the shape ``text`` / ``vision`` to ``target``
    (built on ``device``)."""
    import torch
    import transformers
    from transformers import Qwen2VLImageProcessorPil

    names = {"qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
             "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration")}[arch]
    config_class, model_class = (getattr(transformers, n) for n in names)

    tok = tokenizer(text.get("vocab_size"))
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text = {**text, "vocab_size": text.get("vocab_size", len(tok)), "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = config_class(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"],
                              tie_word_embeddings=text.get("tie_word_embeddings", True))
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(config)
    if dtype is not None:
        model = model.to(dtype)
    target = Path(target)
    model.save_pretrained(target)
    tok.save_pretrained(target)
    images = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)   # no torchvision
    images.save_pretrained(target)
    return target
