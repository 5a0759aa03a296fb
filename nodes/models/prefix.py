"""Scoring a GRPO group with one forward of its prompt.

A GRPO batch holds ``samples_per_prompt`` completions of each prompt. Scored row by
row, the trainer runs each prompt's tokens through the model once per sample. Here
each distinct prompt (its tokens and its left padding) runs once, its keys and values
are copied to the rows that share it, and only the completions run row by row.
Gradients flow back through the copied keys and values into the prompt's forward, so
the logprobs and the gradients are the plain forward's, up to float rounding
(``tests/test_prefix.py``). The saving is the prompt's share of the tokens, times
``1 - 1/samples_per_prompt``. With pictures in the prompts (``pixels``: each row's ``pixel_values``), rows
share a prompt only where their pictures are the same too (``keys``: :func:`nodes.models.vision.image_key`), and
the vision tower runs once per distinct prompt, in its forward.

>>> import torch
>>> ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6]])
>>> first, inverse = groups(ids, torch.ones_like(ids))
>>> first.tolist(), inverse.tolist()
([0, 2], [0, 0, 1, 0])
"""

from __future__ import annotations

import torch

from omnigraph.sdk.adapters.transformers import (generate_inputs, has_rope_index, repeat_cache_rows, rope_index,
                                                 set_rope_deltas)

from nodes.models import vision


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding (what ``generate`` uses), so trainer and rollout agree."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def positions(model, ids: torch.Tensor, mask: torch.Tensor, pixels: list | None = None) -> torch.Tensor:
    """Each token's position, as the rollout placed it: :func:`position_ids`, or for a patch-grid model's rows
    with pictures (``pixels``: each row's, :mod:`nodes.models.vision`), its 3-D positions ``[3, b, n]``."""
    grids = [p[vision.GRID] for p in pixels or () if isinstance(p, dict)]
    if not grids or not has_rope_index(model):
        return position_ids(mask)
    return rope_index(model, ids, mask, torch.cat(grids).to(ids.device))[0]


def groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
           keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first, inverse)``: the first row of each distinct prompt, and each row's prompt (an index into
    ``first``); ``None`` when fewer than half the rows repeat a prompt (sharing would save too little).
    ``keys`` (one number per row): rows are one prompt only where their keys are equal too."""
    n = prompt_ids.shape[0]
    parts = [prompt_ids, prompt_mask.to(prompt_ids.dtype)]
    if keys is not None:
        parts.append(keys.to(prompt_ids.dtype).reshape(n, 1))
    rows = torch.cat(parts, 1)
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if 2 * len(distinct) > n:
        return None
    first = torch.full((len(distinct),), n, dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=inverse.device), "amin")
    order = torch.argsort(first)              # prompts in the order they first appear
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    return first[order], rank[inverse]


def pictures(pixels: list | None, rows, device) -> dict:
    """The pixel inputs (``{"pixel_values": ...}``, and the grids of a patch-grid model) of ``rows`` (indices
    into ``pixels``, each row's or ``None``) on ``device``, in row order (the order a model fills its image
    tokens in); ``{}`` where they have none."""
    if pixels is None:
        return {}
    found = [pixels[int(i)] for i in rows if pixels[int(i)] is not None]
    return vision.model_inputs(vision.concat(found), device) if found else {}


def rows_inputs(ids: torch.Tensor, pixels: list | None, rows, keys: torch.Tensor | None = None,
                features=None) -> dict:
    """A forward's ``input_ids`` and pictures for ``rows`` (indices into ``pixels``) whose ids are ``ids``: their
    pixel inputs, or where ``features`` (a :class:`~nodes.models.picture_cache.FeatureCache`) keeps a frozen
    tower's output, that."""
    rows = [int(i) for i in rows]
    if features is not None and pixels is not None and keys is not None and \
            any(pixels[i] is not None for i in rows):
        return features.inputs(ids, [pixels[i] for i in rows], [int(keys[i]) for i in rows])
    return {"input_ids": ids, **pictures(pixels, rows, ids.device)}


def completion_logits(model, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, prompt_len: int,
                      share: bool = True, keys: torch.Tensor | None = None, pixels: list | None = None,
                      features=None) -> torch.Tensor:
    """Logits ``[b, c, V]`` predicting ``ids[:, P:]`` (``c = ids.shape[1] - P`` completion tokens), from the
    positions ``P - 1 .. P + c - 2``: one forward of each distinct prompt when the rows share prompts (and
    ``share``), else one forward of the whole rows. The output head runs only where a completion token is
    predicted: the head of a large vocabulary is a good part of a small model's compute. ``keys`` and ``pixels``:
    the rows' pictures (the module docstring); ``features``: a frozen tower's output kept (:func:`rows_inputs`).
    ``position_ids``: ``[b, n]``, or ``[3, b, n]`` (:func:`positions`)."""
    P = prompt_len
    c = ids.shape[1] - P
    found = groups(ids[:, :P], mask[:, :P], keys) if share and P > 0 else None
    if found is None:
        out = model(attention_mask=mask[:, :-1], position_ids=position_ids[..., :-1], logits_to_keep=c,
                    **rows_inputs(ids[:, :-1], pixels, range(len(ids)), keys, features))
        return out.logits
    from transformers import DynamicCache

    first, inverse = found
    cache = DynamicCache(config=getattr(model, "config", None))
    head = model(attention_mask=mask[first, :P], position_ids=position_ids[..., first, :P], past_key_values=cache,
                 use_cache=True, logits_to_keep=1, **rows_inputs(ids[first, :P], pixels, first, keys, features))
    # index_select, not indexing: its backward sums each prompt's rows in a fixed order (bit-identical reruns)
    first_logits = head.logits.index_select(0, inverse)     # [b, 1, V]: each row's first completion token
    if c == 1:
        return first_logits
    cache = head.past_key_values
    repeat_cache_rows(cache, inverse)             # each row's copy of its prompt's keys and values
    rest = model(input_ids=ids[:, P:-1], attention_mask=mask[:, :-1], position_ids=position_ids[..., P:-1],
                 past_key_values=cache, use_cache=True, logits_to_keep=c - 1)
    return torch.cat([first_logits, rest.logits], 1)


def prefill(model, ids: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor | None = None,
            pixels: list | None = None, placeholders: list[int] | None = None):
    """For ``generate``: a KV cache of every token but the last of the rows ``ids`` (left padded), computed
    once per distinct row and copied to the rows that repeat it; ``None`` when fewer than half the rows repeat
    one. Given it, ``generate`` runs only the last token of each row and then decodes, instead of a GRPO
    group's prompt once per sample. ``keys`` and ``pixels``: the rows' pictures (the module docstring);
    ``placeholders``: the image tokens' ids. A row that ends in a picture (an agent's turn can) is left to
    ``generate`` whole: its last token is not prefilled here, and a picture is read with all its tokens."""
    if placeholders and torch.isin(ids[:, -1], torch.tensor(placeholders, device=ids.device)).any():
        return None
    found = groups(ids, mask, keys) if ids.shape[1] > 1 else None
    if found is None:
        return None
    from transformers import DynamicCache

    first, inverse = found
    cache = DynamicCache(config=getattr(model, "config", None))
    ids, mask = ids[first, :-1], mask[first, :-1]
    shown = pictures(None if pixels is None else [pixels[int(i)] for i in first], range(len(first)), ids.device)
    pos = position_ids(mask)
    if has_rope_index(model):
        # a patch-grid model's 3-D positions; generate places each row's next tokens by its offset from them
        deltas = torch.zeros(len(first), 1, dtype=torch.long, device=ids.device)
        if vision.GRID in shown:
            pos, deltas = rope_index(model, ids, mask, shown[vision.GRID])
        set_rope_deltas(model, deltas.index_select(0, inverse))
    model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
          logits_to_keep=1, **shown)
    repeat_cache_rows(cache, inverse)
    return cache


def generate_pictures(model, ids: torch.Tensor, pixels: list | None, cache) -> dict:
    """What ``generate`` reads of the rows' pictures beside ``ids``: nothing where :func:`prefill` read them
    (``cache``); else their pixel inputs, and for a patch-grid model which tokens are pictures."""
    seen = {} if cache is not None else pictures(pixels, range(len(ids)), ids.device)
    return {**seen, **generate_inputs(model, ids)} if seen else seen
