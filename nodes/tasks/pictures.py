"""A data row's pictures (``task.image``): read, checked and kept as encoded files, before training starts.

A row's picture field holds a path (relative to the data file's folder, or absolute), a list of paths, the
encoded bytes, a ``datasets`` ``Image`` value as stored (``{"bytes": ..., "path": ...}``) or as decoded (a PIL
image). Each picture is opened and decoded once here, so that a missing, truncated or non-image file stops
the run before its first step with the row and the file named, and a picture over ``max_pixels`` is refused
with the limit said (the model's processor resizes every picture it takes to its own size; this bound
keeps a stray poster-sized file from reaching it).

>>> import io
>>> from PIL import Image
>>> buf = io.BytesIO(); Image.new("RGB", (4, 3)).save(buf, format="PNG")
>>> [len(b) > 0 for b in read(buf.getvalue(), Path("."), "row 0")]
[True]
>>> place("count:", 2), place("<image> vs <image>: same?", 2)
('<image><image>count:', '<image> vs <image>: same?')
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from omnigraph.sdk import ConfigError

from nodes.models.vision import PLACEHOLDER

FIX = "fix the file or the row's path, or set task.on_missing: filter and empty the row's picture field"


def read(value: Any, base: Path, row: str, max_pixels: int = 4096 * 4096) -> tuple[bytes, ...]:
    """The encoded files of one row's picture field (see the module docstring), each checked."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return tuple(_one(v, base, row, max_pixels) for v in items)


def _one(value: Any, base: Path, row: str, max_pixels: int) -> bytes:
    name = "its picture"
    if isinstance(value, dict):                               # datasets' Image feature, as stored
        value = value.get("bytes") or value.get("path")
    if hasattr(value, "save") and hasattr(value, "size"):      # a decoded PIL image
        buf = io.BytesIO()
        value.save(buf, format="PNG")
        value = buf.getvalue()
    if isinstance(value, str):
        path = Path(value).expanduser()
        path = path if path.is_absolute() else base / path
        name = f"picture '{value}'"
        if not path.is_file():
            raise ConfigError(f"{row}: {name} does not exist (looked at {path})", where="task.image", fix=FIX)
        value = path.read_bytes()
    if not isinstance(value, (bytes, bytearray)):
        raise ConfigError(f"{row}: {name} is a {type(value).__name__}, not a path, bytes or an image",
                          where="task.image", fix="hold a file path (or a list of them) in the row's picture field")
    check(bytes(value), f"{row}: {name}", max_pixels)
    return bytes(value)


def check(blob: bytes, what: str, max_pixels: int) -> None:
    """Decode ``blob`` whole (a truncated file fails here, not mid-run); refuse one over ``max_pixels``."""
    try:
        img = Image.open(io.BytesIO(blob))
        w, h = img.size
        if w * h > max_pixels:
            raise ConfigError(f"{what} is {w}x{h} pixels, over task.max_image_pixels = {max_pixels}",
                              where="task.max_image_pixels", fix="shrink the picture, or raise the limit")
        img.load()
    except ConfigError:
        raise
    except Image.DecompressionBombError as e:
        raise ConfigError(f"{what} is refused as too large to decode: {e}", where="task.max_image_pixels",
                          fix="shrink the picture") from None
    except UnidentifiedImageError:
        raise ConfigError(f"{what} is not in a picture format PIL reads (PNG, JPEG, WebP, GIF, ...)",
                          where="task.image", fix=FIX) from None
    except (OSError, SyntaxError, ValueError) as e:
        raise ConfigError(f"{what} is not an image that can be read: {e}", where="task.image", fix=FIX) from None


def place(text: str, n: int) -> str:
    """``text`` with a placeholder for each of ``n`` pictures: as written, or all before the text."""
    return text if PLACEHOLDER in text else PLACEHOLDER * n + text


def into_messages(messages: list[dict], n: int) -> list[dict]:
    """Chat messages with ``n`` image parts at the start of the first user message (unless a message already
    has image parts): the content a model's chat template renders into its image tokens."""
    if any(isinstance(m["content"], list) for m in messages):
        return messages
    out = [dict(m) for m in messages]
    for m in out:
        if m["role"] == "user":
            m["content"] = [{"type": "image"}] * n + [{"type": "text", "text": m["content"]}]
            break
    return out
