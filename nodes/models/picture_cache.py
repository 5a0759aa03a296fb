"""A frozen vision tower's output, computed once per sample's pictures and kept (``model.freeze: [vision]``).

With the tower frozen, a picture's features (the tower's output, its merger included) are the same at every
step of the run. The trainer's forwards would still run the tower on every picture of every micro-batch:
``old_logprob``'s, then the update's. Here each distinct sample's pictures (keyed by the batch's ``image_key``)
run through the tower once, one sample at a time (so what is kept does not depend on which samples shared a
batch: a run resumed from a checkpoint computes the same bits); the output is kept and given to the model's
forward instead of the pixels (:func:`omnigraph.sdk.adapters.transformers.with_picture_features`). The oldest
are dropped past ``limit_bytes``. A patch-grid model's (Qwen2-VL, Qwen2.5-VL) kept output is its pictures'
features, merger included; LLaVA's is its tower's selected hidden states, and its projector (which trains) runs
on them in every forward.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from omnigraph.sdk.adapters.transformers import picture_features, with_picture_features

from nodes.models import vision


class FeatureCache:
    def __init__(self, model, limit_bytes: int = 1 << 30):
        self.model, self.limit = model, limit_bytes
        self.kept: OrderedDict[int, list[torch.Tensor]] = OrderedDict()
        self.bytes = 0
        self.computed = self.reused = 0
        """Samples whose pictures ran through the tower here, and samples served from what was kept."""

    def inputs(self, ids: torch.Tensor, items: list, keys: list[int]) -> dict:
        """The forward's keyword arguments for rows ``ids`` whose pixel inputs are ``items`` (``None``: a row
        without pictures) and ``keys`` their ``image_key``: the ids, and the pictures' features in row order."""
        rows = [(int(k), it) for k, it in zip(keys, items) if it is not None]
        have = {k: self.kept[k] for k, _ in rows if k in self.kept}
        todo = {k: it for k, it in rows if k not in have}
        self.computed += len(todo)
        self.reused += len(rows) - len(todo)
        for k, it in todo.items():            # one sample at a time: its features never depend on the batch
            with torch.no_grad():
                have[k] = [f.detach() for f in picture_features(self.model, vision.model_inputs(it, ids.device))]
            self._keep(k, have[k])
        shown = [f for k, _ in rows for f in have[k]]
        return {"input_ids": ids, **(with_picture_features(self.model, shown) if shown else {})}

    def _keep(self, key: int, feats: list[torch.Tensor]) -> None:
        self.kept[key] = feats
        self.bytes += sum(f.numel() * f.element_size() for f in feats)
        while self.bytes > self.limit and len(self.kept) > 1:
            _, old = self.kept.popitem(last=False)
            self.bytes -= sum(f.numel() * f.element_size() for f in old)
