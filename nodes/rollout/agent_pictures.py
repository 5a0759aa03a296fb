"""Pictures through the agents' endpoint (:mod:`nodes.rollout.agent_server`), for an image-text policy.

- :func:`task_messages`: a prompt's messages as an agent gets them, each picture an OpenAI image part
  (``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``), so that an agent can send the
  task's messages as they are.
- :func:`check_parts`: a request's content parts, refused in OpenAI's shape where the endpoint cannot read
  them (a remote URL: the endpoint fetches nothing; bad base64; a file that is not a picture).
- :func:`request_pictures`: a request's messages with each image part as the ``{"type": "image"}`` part chat
  templates render, and the pictures in their order.
- :class:`Expander`: a rendered text's placeholders expanded into the image tokens the model reads (as its
  processor counts them), so the endpoint's token-exact bookkeeping works in text as for text-only turns.

>>> parts = task_messages(Prompt("<image>colour:", images=(PNG,)))[0]["content"]
>>> [p["type"] for p in parts], parts[0]["image_url"]["url"][:22]
(['image_url', 'text'], 'data:image/png;base64,')
>>> msgs, pics = request_pictures([{"role": "user", "content": parts}])
>>> msgs[0]["content"][0], pics == [PNG]
({'type': 'image'}, True)
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from typing import Any

from PIL import Image

from omnigraph.sdk import Prompt
from omnigraph.sdk.adapters.transformers import image_token_counts

from nodes.models import vision
from nodes.rollout.agent_broker import AgentError
from nodes.tasks.prompting import messages

DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,(.*)", re.S)
PARTS = ("text", "image_url")


def data_url(blob: bytes) -> str:
    """A picture's bytes as a ``data:`` URL of its own format."""
    fmt = (Image.open(io.BytesIO(blob)).format or "png").lower()
    return f"data:image/{fmt};base64,{base64.b64encode(blob).decode()}"


def task_messages(prompt: Prompt) -> list[dict[str, Any]]:
    """The prompt's chat messages with its pictures as image parts, in order (a plain prompt: one user message
    whose ``<image>`` placeholders become the parts)."""
    urls = iter([data_url(b) for b in prompt.images])
    out = []
    for m in messages(prompt):
        c = m.get("content")
        if isinstance(c, list):
            parts = [{"type": "image_url", "image_url": {"url": next(urls)}} if p.get("type") == "image" else p
                     for p in c]
        elif isinstance(c, str) and vision.PLACEHOLDER in c:
            parts = []
            for k, text in enumerate(c.split(vision.PLACEHOLDER)):
                if k:
                    parts.append({"type": "image_url", "image_url": {"url": next(urls)}})
                if text:
                    parts.append({"type": "text", "text": text})
        else:
            parts = c
        out.append({**m, "content": parts})
    return out


def _url(part: dict) -> Any:
    url = part.get("image_url")
    return url.get("url") if isinstance(url, dict) else url


def _decode(url: Any, where: str, max_pixels: int) -> bytes:
    if not isinstance(url, str):
        raise AgentError(400, f"{where}: an image part needs image_url.url", param=where)
    m = DATA_URL.fullmatch(url.strip())
    if m is None:
        raise AgentError(400, f"{where}: only data: URLs (data:image/...;base64,...) are read; the endpoint fetches "
                              "nothing from the network", param=where)
    try:
        blob = base64.b64decode(m.group(1), validate=True)
    except (binascii.Error, ValueError):
        raise AgentError(400, f"{where}: the data URL is not valid base64", param=where) from None
    try:
        img = Image.open(io.BytesIO(blob))
        w, h = img.size
    except Exception as e:  # noqa: BLE001 - PIL's many ways of refusing a file
        raise AgentError(400, f"{where}: not a picture PIL can read ({type(e).__name__})", param=where) from None
    if w * h > max_pixels:
        raise AgentError(400, f"{where}: the picture is {w}x{h} pixels, over the endpoint's limit of {max_pixels}",
                         param=where)
    return blob


MAX_PIXELS = 4096 * 4096
"""The largest picture a request may hold (``task.max_image_pixels``'s default)."""


def check_parts(messages: list, pictures: bool, max_pixels: int = MAX_PIXELS) -> None:
    """Refuse content parts the endpoint cannot read (``pictures``: whether the policy takes any)."""
    for i, m in enumerate(messages):
        c = m.get("content")
        if not isinstance(c, list):
            continue
        for j, p in enumerate(c):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(p, dict) or p.get("type") not in PARTS:
                raise AgentError(400, f"{where}: parts of type {list(PARTS)} are read", param=where)
            if p["type"] == "image_url":
                if not pictures:
                    raise AgentError(400, f"{where}: this policy reads text only (its model takes no pictures)",
                                     param=where)
                _decode(_url(p), where, max_pixels)


def request_pictures(messages: list) -> tuple[list[dict[str, Any]], list[bytes]]:
    """``(messages, pictures)``: each image part as ``{"type": "image"}``, and the pictures' bytes in order."""
    pics, out = [], []
    for m in messages:
        c = m.get("content")
        if isinstance(c, list) and any(isinstance(p, dict) and p.get("type") == "image_url" for p in c):
            parts = []
            for p in c:
                if p.get("type") == "image_url":
                    pics.append(_decode(_url(p), "image part", 2**62))
                    parts.append({"type": "image"})
                else:
                    parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out, pics


def placeholders_in(messages: list[dict[str, Any]]) -> int:
    """The ``{"type": "image"}`` parts of ``messages``."""
    return sum(1 for m in messages if isinstance(m.get("content"), list)
               for p in m["content"] if isinstance(p, dict) and p.get("type") == "image")


class Expander:
    """A model's processor, for rendered texts: each placeholder expanded into as many image tokens as the
    processor gives its picture, and the pictures' pixel values (as :func:`nodes.models.vision.encode` makes
    them for the rollout's own prompts)."""

    def __init__(self, proc):
        self.proc = proc
        self.token = getattr(proc, "image_token", vision.PLACEHOLDER)

    def counts(self, pics: list[bytes]) -> list[int]:
        sizes = [Image.open(io.BytesIO(b)).size[::-1] for b in pics]
        found = image_token_counts(self.proc, sizes)
        if found is None:                      # a processor that does not say: count what it expands
            tok = self.proc.tokenizer
            ids = tok.convert_tokens_to_ids(self.token)
            found = [self.proc(text=[self.token], images=vision.open_images([b]))["input_ids"][0].tolist().count(ids)
                     for b in pics]
        return found

    def expand(self, text: str, pics: list[bytes]) -> str:
        """``text`` (rendered with a placeholder per picture, the first ``len(pics)`` of them) expanded."""
        text = vision.with_image_tokens(self.proc, text)
        pieces = text.split(self.token)
        if len(pieces) - 1 != len(pics):
            raise AgentError(400, f"the request's text holds {len(pieces) - 1 - len(pics):+d} '{self.token}' beyond "
                                  "its image parts: pictures are sent as image parts only", param="messages")
        counts = self.counts(pics)
        return "".join(p + (self.token * counts[k] if k < len(counts) else "") for k, p in enumerate(pieces))

    def pixels(self, pics: list[bytes]):
        return vision.pixel_inputs(self.proc, vision.open_images(pics))


PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
"""A 1x1 picture, for the examples above."""
