"""transformers' private and internal parts that omnigraph uses, in one place (see :mod:`omnigraph.sdk.adapters`).

- ``AutoModelForCausalLM._model_mapping``: the class ``AutoModelForCausalLM.from_pretrained`` would build for
  a config, looked up without building it (the lookup imports the architecture's modelling module): the warm
  workers import a model's code once, in the process the actors are forked from;
- ``transformers.models.auto.tokenization_auto.tokenizer_class_from_name``: the same for a tokenizer class
  named in ``tokenizer_config.json`` (not exported at the top level);
- ``PretrainedConfig._attn_implementation``: the attention implementation a loaded model uses (the static
  decoder gives ``sdpa`` models its grouped-query attention); there is a setter on the model, no public getter;
- ``transformers.integrations.sdpa_attention.sdpa_attention_forward`` and ``transformers.masking_utils.sdpa_mask``:
  transformers' own ``sdpa`` attention and its masks, which an attention registered under a new name falls
  back to and reuses (internal modules, not exported at the top level);
- ``ProcessorMixin._get_num_multimodal_tokens``: how many tokens a picture of a given size expands to, by an
  image-text model's processor (the prompt-length check of data with pictures counts them);
- a causal LM's forward computing ``logits = lm_head(hidden_states[:, kept])`` and nothing more (no scale, no
  soft cap) for the architectures in :data:`PLAIN_HEAD`: :func:`plain_output_head` lets a trainer set the
  head aside and compute log-probs from the hidden states in chunks;
- ``<Qwen2-VL base model>.get_rope_index`` and ``.rope_deltas``: the 3-D rotary positions (time, height, width)
  of a patch-grid image-text model's tokens (Qwen2-VL, Qwen2.5-VL), which the trainer passes explicitly so its
  forward reads the positions ``generate`` used, and the offset ``generate`` adds to the text positions of a
  cache it did not fill (:func:`rope_index`, :func:`set_rope_deltas`); its ``get_image_features`` (each picture's
  features as its forward computes them) and the scatter of features into the image tokens' embeddings that its
  forward's ``mm_encoder_outputs``, which takes them instead of pixels, and LLaVA's ``vision_tower`` and
  ``multi_modal_projector`` with its feature-layer selection (:func:`picture_features`,
  :func:`with_picture_features`: a frozen tower's output, kept);
- ``DynamicCache.layers[i].keys`` / ``.values``: a cache's tensors, which :func:`repeat_cache_rows` expands with
  ``index_select`` (``DynamicCache.batch_select_indices`` indexes them, and the backward of an index with
  repeated rows adds its gradients in an order that varies from run to run on a CPU with several threads).

>>> from types import SimpleNamespace
>>> attn_implementation(SimpleNamespace(_attn_implementation="sdpa")), attn_implementation(None)
('sdpa', None)
"""

from __future__ import annotations


from . import check

SUPPORTED = ">=5.19,<5.20"
"""The transformers versions this adapter was written for (the project pins 5.19.0)."""

_version: str | None = None


def check_version() -> str:
    """The installed transformers version, checked once; :class:`~omnigraph.sdk.adapters.UnsupportedVersion` outside
    :data:`SUPPORTED`."""
    global _version
    if _version is None:
        _version = check("transformers", ("transformers",), SUPPORTED, __name__)
    return _version


def causal_lm_class(config):
    """The class ``AutoModelForCausalLM`` builds for ``config`` (importing its modelling module); for an
    image-text model (a config with a vision tower), the class ``AutoModelForImageTextToText`` builds."""
    check_version()
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    return auto._model_mapping[type(config)]


def tokenizer_class(name: str):
    """The tokenizer class called ``name`` (importing its module), or None where transformers has none."""
    check_version()
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
    return tokenizer_class_from_name(name)


def attn_implementation(config) -> str | None:
    """The attention implementation a model's ``config`` names (``"sdpa"``, ``"eager"``, a registered name), or
    None where it names none."""
    check_version()
    return getattr(config, "_attn_implementation", None)


def sdpa_attention_forward():
    """transformers' ``sdpa`` attention function (what a model with ``attn_implementation="sdpa"`` calls)."""
    check_version()
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as forward
    return forward


def register_attention(name: str, forward) -> None:
    """Register ``forward`` as the attention called ``name``, with ``sdpa``'s masks (a model then takes it with
    ``model.set_attn_implementation(name)``)."""
    check_version()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)


def repeat_cache_rows(cache, index) -> None:
    """Make row ``i`` of every layer of ``cache`` (a ``DynamicCache``) a copy of its row ``index[i]``, in place,
    with a backward that is the same on every run: ``index_select``'s backward adds the rows' gradients in
    ``index``'s order, where that of ``DynamicCache.batch_select_indices`` (advanced indexing: an accumulating
    ``index_put_``) adds them in whatever order the CPU's threads reach them."""
    check_version()
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)


def image_token_counts(processor, sizes: list[tuple[int, int]]) -> list[int] | None:
    """The tokens each picture of ``(height, width)`` in ``sizes`` expands to, by ``processor``'s own count;
    None where the processor does not say."""
    check_version()
    count = getattr(processor, "_get_num_multimodal_tokens", None)
    if count is None or not sizes:
        return None if count is None else []
    data = count(image_sizes=[list(s) for s in sizes])
    found = getattr(data, "num_image_tokens", None)
    if found is None and isinstance(data, dict):
        found = data.get("num_image_tokens")
    return None if found is None else [int(n) for n in found]


PLAIN_HEAD = ("llama", "mistral", "qwen2", "qwen3", "llava", "phi3", "olmo2", "smollm3", "qwen2_vl", "qwen2_5_vl")
"""``config.model_type`` of the architectures whose forward's logits are the output head's plain product in
transformers 5.19 (checked by reading their ``forward``); others are scored with their whole logits."""


def plain_output_head(model):
    """The output head (an ``nn.Linear``) of a model whose logits are its plain product, else None: another
    architecture, a head with a scale or soft cap in its config, or a head an adapter wraps (LoRA on it)."""
    import torch

    check_version()
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in PLAIN_HEAD or any(getattr(config, k, None) not in (None, 1, 1.0)
                                     for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return None
    head = model.get_output_embeddings()
    return head if type(head) is torch.nn.Linear else None


def _rope_base(model):
    """The base model that owns a patch-grid model's 3-D rotary positions (through a LoRA wrapper), or None."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    base = getattr(inner, "model", None)
    return base if callable(getattr(base, "get_rope_index", None)) else None


def has_rope_index(model) -> bool:
    """Whether ``model`` places its tokens with 3-D rotary positions computed from its pictures' grids."""
    check_version()
    return _rope_base(model) is not None


def rope_index(model, ids, mask, image_grid_thw):
    """``(positions [3, b, n], deltas [b, 1])`` of rows ``ids`` (``mask``: their attention mask, left padding
    and all) of a patch-grid model, its pictures' grids ``image_grid_thw`` ``[pictures, 3]`` in row order; the
    positions of padding are 0, as ``generate``'s."""
    check_version()
    base = _rope_base(model)
    kinds = (ids == base.config.image_token_id).int()
    return base.get_rope_index(ids, mm_token_type_ids=kinds, image_grid_thw=image_grid_thw, attention_mask=mask)


def set_rope_deltas(model, deltas) -> None:
    """Tell a patch-grid model's ``generate`` the offset of each row's next text position (``deltas`` ``[b, 1]``)
    for a KV cache filled outside it: ``generate`` computes it only when it runs the prompt itself."""
    check_version()
    _rope_base(model).rope_deltas = deltas


def generate_inputs(model, ids) -> dict:
    """What a patch-grid model's ``generate`` needs beside the pixels to place a prompt's picture tokens
    (``mm_token_type_ids``; without it, it places them as text, silently); ``{}`` for any other model."""
    check_version()
    base = _rope_base(model)
    return {} if base is None else {"mm_token_type_ids": (ids == base.config.image_token_id).int()}


def _vl_base(model):
    """The base model of an image-text model (through a LoRA wrapper): LLaVA's or a patch-grid model's."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(inner, "model", None)


def keeps_tower_output(model) -> bool:
    """Whether a frozen tower's output can be kept for ``model``: a patch-grid model (its merger is part of the
    tower), or LLaVA with one feature layer (its projector, which trains, then runs on the kept output)."""
    check_version()
    if _rope_base(model) is not None:
        return True
    config = getattr(_vl_base(model), "config", None)
    return getattr(config, "model_type", None) == "llava" and isinstance(config.vision_feature_layer, int)


def picture_features(model, pixels: dict) -> list:
    """Each picture's output of a frozen tower, from its pixel inputs (``pixel_values``, and ``image_grid_thw``
    for a patch-grid model): a patch-grid model's features as its forward places them (the merger included);
    LLaVA's selected hidden states (``vision_feature_layer``, ``vision_feature_select_strategy``), before the
    projector."""
    check_version()
    base = _rope_base(model)
    if base is not None:
        out = base.get_image_features(pixels["pixel_values"], pixels["image_grid_thw"], return_dict=True)
        return list(out.pooler_output)
    base = _vl_base(model)
    c = base.config
    hidden = base.vision_tower(pixels["pixel_values"], output_hidden_states=True, return_dict=True).hidden_states
    chosen = hidden[c.vision_feature_layer]
    return list(chosen[:, 1:] if c.vision_feature_select_strategy == "default" else chosen)


def with_picture_features(model, features: list) -> dict:
    """The forward's keyword arguments that give it each picture's kept tower output (:func:`picture_features`, in
    order) in place of its pixels: its ``mm_encoder_outputs``, after LLaVA's projector (which trains)."""
    check_version()
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    if _rope_base(model) is None:
        features = list(_vl_base(model).multi_modal_projector(torch.stack(features)))
    return {"mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=tuple(features))}}
