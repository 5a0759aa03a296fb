"""A processor for patch-grid image-text models (Qwen2-VL, Qwen2.5-VL) that needs no torchvision.

transformers' own processor for these models (``Qwen2_5_VLProcessor``) cannot be built without a video
processor, and its video processor needs torchvision. A picture's tokens need neither: the image processor
(the PIL one, which transformers falls back to without torchvision) cuts the picture into 14x14 patches on a
grid of ``t x h x w`` and returns them with the grid (``image_grid_thw``); the prompt's ``<|image_pad|>`` stands
for ``t * h * w / merge_size**2`` tokens. :class:`GridProcessor` does that with the checkpoint's own image
processor, tokenizer and chat template, so a user's Qwen2.5-VL folder loads unchanged, and answers what the
rest of omnigraph asks of a processor (``image_token``, ``__call__``, ``apply_chat_template``, the token count
of a picture of a given size). Videos are not read.

>>> GridProcessor.expand("a<P>b<P>", "<P>", [2, 1])
'a<P><P>b<P>'
"""

from __future__ import annotations

import json
from pathlib import Path

KINDS = ("qwen2_vl", "qwen2_5_vl")
"""``config.model_type`` of the models this processor serves."""


def serves(model_dir: Path) -> bool:
    config = Path(model_dir) / "config.json"
    return config.exists() and json.loads(config.read_text()).get("model_type") in KINDS


class GridProcessor:
    """The image processor and tokenizer of a patch-grid model, as one processor."""

    def __init__(self, image_processor, tokenizer, chat_template: str | None = None,
                 image_token: str = "<|image_pad|>"):
        self.image_processor, self.tokenizer = image_processor, tokenizer
        self.image_token = image_token
        self.image_text = "<|vision_start|>" + image_token + "<|vision_end|>"     # a picture in a plain prompt
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)

    @classmethod
    def from_pretrained(cls, model_dir: Path) -> "GridProcessor":
        from transformers import AutoImageProcessor, AutoTokenizer

        model_dir = Path(model_dir)
        template = None
        for name in ("chat_template.jinja", "chat_template.json"):
            if (model_dir / name).exists():
                text = (model_dir / name).read_text()
                template = json.loads(text)["chat_template"] if name.endswith(".json") else text
                break
        return cls(AutoImageProcessor.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir), template)

    @staticmethod
    def expand(text: str, token: str, counts: list[int]) -> str:
        """``text`` with its ``i``-th ``token`` repeated ``counts[i]`` times."""
        pieces = text.split(token)
        if len(pieces) - 1 != len(counts):
            raise ValueError(f"{len(pieces) - 1} '{token}' in the text for {len(counts)} picture(s)")
        return pieces[0] + "".join(token * n + p for n, p in zip(counts, pieces[1:]))

    def tokens_per_grid(self, grid) -> list[int]:
        merge = self.image_processor.merge_size
        return [int(g.prod()) // merge ** 2 for g in grid]

    def __call__(self, text: list[str], images: list | None = None, return_tensors: str = "pt",
                 add_special_tokens: bool = False, **_) -> dict:
        """``input_ids`` (and ``attention_mask``) of ``text`` with each picture's placeholder expanded, its
        ``pixel_values`` (the patches of every picture, one after another) and ``image_grid_thw``."""
        out = {}
        if images:
            pix = self.image_processor(images=images, return_tensors=return_tensors)
            out = {"pixel_values": pix["pixel_values"], "image_grid_thw": pix["image_grid_thw"]}
            counts = self.tokens_per_grid(pix["image_grid_thw"])
            at = 0
            expanded = []
            for t in text:
                k = t.count(self.image_token)
                expanded.append(self.expand(t, self.image_token, counts[at:at + k]))
                at += k
            text = expanded
        enc = self.tokenizer(text, add_special_tokens=add_special_tokens, return_tensors=return_tensors)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], **out}

    def apply_chat_template(self, messages: list[dict], **kwargs) -> str:
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, **kwargs)

    def _get_num_multimodal_tokens(self, image_sizes: list | None = None, **_) -> dict:
        """The tokens a picture of each ``(height, width)`` expands to (as transformers' processors answer)."""
        merge = self.image_processor.merge_size
        return {"num_image_tokens": [self.image_processor.get_number_of_image_patches(h, w, {}) // merge ** 2
                                     for h, w in image_sizes or []]}
