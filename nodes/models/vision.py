"""Pictures in prompts: an image-text model's processor, and a prompt's token ids with its pixels.

A prompt carries its pictures as encoded files (``Prompt.images``: PNG, JPEG, ... bytes). Where they go:
in a plain prompt, the placeholder ``<image>`` in its text (one per picture; a model whose processor
names its image token otherwise gets its own there); in chat messages, an ``{"type": "image"}`` part of a
message's content, which the model's chat template renders. The model's processor (``AutoProcessor``,
saved with the model) turns the pictures into the tensors its vision tower takes and the placeholder into
as many image tokens as the tower yields, so the prompt's ids are exactly what the model reads; the
rollout and the trainer run the same pixels.

A prompt's pixel inputs are one tensor (``pixel_values``, LLaVA and its kind) or, for a patch-grid model
(Qwen2-VL, Qwen2.5-VL: :mod:`nodes.models.patch_grid`), a dict of ``pixel_values`` (the patches) and
``image_grid_thw`` (each picture's grid), which the model places by 3-D rotary positions; :func:`concat` joins
several and :func:`model_inputs` makes them a forward's keyword arguments.

>>> import torch
>>> image_key(torch.zeros(1, 3, 2, 2)) == image_key(torch.zeros(1, 3, 2, 2)), image_key(None)
(True, 0)
"""

from __future__ import annotations

import io
import json
import time
import zlib
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from nodes.models import patch_grid

PLACEHOLDER = "<image>"


def is_vision(model_dir: Path) -> bool:
    """Whether the model in ``model_dir`` takes pictures (its config has a vision tower)."""
    config = Path(model_dir) / "config.json"
    return config.exists() and "vision_config" in json.loads(config.read_text())


def processor(model_dir: Path):
    """The model's processor (tokenizer and image processor), or ``None`` for a text-only model."""
    if not is_vision(model_dir):
        return None
    if patch_grid.serves(model_dir):           # transformers' own needs torchvision for its video part
        return patch_grid.GridProcessor.from_pretrained(model_dir)
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir)


def open_images(blobs, where: str = "the prompt") -> list:
    """Each encoded picture as an RGB PIL image; a file PIL cannot read is a ``ValueError`` naming ``where``."""
    out = []
    for i, blob in enumerate(blobs):
        try:
            img = Image.open(io.BytesIO(blob))
            img.load()
        except (UnidentifiedImageError, OSError, SyntaxError) as e:
            raise ValueError(f"{where}: picture {i} is not an image PIL can read ({e})") from None
        out.append(img.convert("RGB"))
    return out


def encode(proc, prompt, text: str, head: list[int]):
    """``(ids, pixel_values)`` of a prompt with pictures: ``head`` (the ids before the text, e.g. bos), then
    ``text`` (the prompt's text or its rendered chat) with each placeholder expanded into the picture's image
    tokens; the pictures' pixel inputs as the processor makes them (float32; :func:`pack`)."""
    token = getattr(proc, "image_token", PLACEHOLDER)
    text = with_image_tokens(proc, text)
    found = text.count(token)
    if found != len(prompt.images):
        raise ValueError(f"the prompt has {len(prompt.images)} picture(s) and {found} placeholder(s) "
                         f"'{token}' for them: {prompt.text[:80]!r}")
    enc = proc(text=[text], images=open_images(prompt.images), return_tensors="pt", add_special_tokens=False)
    return head + enc["input_ids"][0].tolist(), pack(enc)


GRID = "image_grid_thw"


def pack(out):
    """A processor's output for some pictures as their pixel inputs: ``pixel_values`` (float32), with the
    pictures' grids beside it where the processor gives them."""
    px = out["pixel_values"].float()
    return {"pixel_values": px, GRID: out[GRID]} if GRID in out else px


def pixel_inputs(proc, images: list):
    """The pixel inputs of ``images`` (PIL) by ``proc``'s image processor."""
    return pack(proc.image_processor(images=images, return_tensors="pt"))


def concat(items: list):
    """Several pixel inputs (in order) as one."""
    import torch

    if isinstance(items[0], dict):
        return {k: torch.cat([i[k] for i in items]) for k in items[0]}
    return torch.cat(items)


def model_inputs(item, device=None) -> dict:
    """Pixel inputs as a forward's keyword arguments (on ``device``)."""
    kw = dict(item) if isinstance(item, dict) else {"pixel_values": item}
    return kw if device is None else {k: v.to(device) for k, v in kw.items()}


def with_image_tokens(proc, text: str) -> str:
    """``text`` with each ``<image>`` written as ``proc``'s model marks a picture (its image token, and the
    tokens it puts around it where it has any)."""
    token = getattr(proc, "image_text", getattr(proc, "image_token", PLACEHOLDER))
    return text.replace(PLACEHOLDER, token) if token != PLACEHOLDER else text


def placeholder_ids(model) -> list[int]:
    """The ids of the model's image (and video) placeholder tokens (from its config), never to be sampled."""
    config = getattr(model, "config", model)
    ids = [getattr(config, k, None) for k in ("image_token_id", "image_token_index", "video_token_id")]
    return sorted({i for i in ids if isinstance(i, int) and i >= 0})


def image_key(pixels) -> int:
    """A number for one sample's pictures (``0``: none) that differs where the pictures differ: two prompts
    of the same text are one prompt only when their pictures are the same too."""
    import torch

    if pixels is None:
        return 0
    crc = 0
    for v in (pixels.values() if isinstance(pixels, dict) else [pixels]):
        crc = zlib.crc32(v.to(torch.float32).contiguous().numpy().tobytes(), crc)
    return crc + 1


def tower(model):
    """The model's vision tower (a submodule named ``vision_tower``, ``visual`` or ``vision_model``), or None."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in ("vision_tower", "visual", "vision_model"):
            return module
    return None


class EncoderClock:
    """Seconds the model's vision tower runs, from hooks on its forward: what share of generation (or of a
    trainer's forward) the pictures cost. :meth:`take` returns ``(seconds, first start, last end)`` since the last
    call (``(0.0, None, None)`` where the tower did not run)."""

    def __init__(self, model):
        self.clock, self.seconds, self.first, self.last, self._at = time.perf_counter, 0.0, None, None, None
        module = tower(model)
        if module is not None:
            module.register_forward_pre_hook(self._start)
            module.register_forward_hook(self._end)

    def _start(self, module, args) -> None:
        self._at = self.clock()
        self.first = self._at if self.first is None else self.first

    def _end(self, module, args, out) -> None:
        self.last = self.clock()
        self.seconds += self.last - self._at

    def take(self) -> tuple[float, float | None, float | None]:
        out = (self.seconds, self.first, self.last)
        self.seconds, self.first, self.last = 0.0, None, None
        return out
