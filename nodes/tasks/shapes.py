"""``shapes``: a visual task for an image-text policy (the embedded ``tiny-vl`` model learns it).

Each prompt is one small picture, ``1..max_count`` coloured squares on a dark ground, and a question:
``colour:`` (the squares share one colour; the target is its name) or ``count:`` (squares of any colours;
the target is how many there are), scored by :func:`nodes.rewards.rules.exact_match`. The picture travels with the prompt as PNG bytes
(``Prompt.images``); the prompt's text holds the model's image token where the picture goes (the
rollout expands it into the image's tokens). Layouts whose hash falls in the held-out slice are the eval
split, never trained on.

>>> task = Shapes(prompts=2, seed=0)
>>> [(p.text, p.meta["target"], len(p.images)) for p in task.batch(0)]
[('<image>colour:', 'blue', 1), ('<image>colour:', 'purple', 1)]
>>> Shapes(prompts=1, seed=0, question="count").batch(0)[0].meta
{'target': '2'}
>>> draw(["red", "blue"], [0, 15], size=32).size
(32, 32)
"""

from __future__ import annotations

import io
import random
from typing import Literal

from PIL import Image, ImageDraw
from pydantic import Field

from omnigraph.sdk import Options, Prompt

from nodes.tasks.procedural import Task

COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 90, 240), "yellow": (240, 220, 40),
           "white": (235, 235, 235), "purple": (150, 50, 200)}     # names with distinct first letters
GRID = 4                                   # a GRID x GRID board of cells, at most one square in each
IMAGE_TOKEN = "<image>"


def draw(colours: list[str], cells: list[int], size: int = 32, jitter: random.Random | None = None):
    """A ``size`` x ``size`` RGB picture: one square of each colour in its cell (``0 .. GRID**2 - 1``)."""
    img = Image.new("RGB", (size, size), (20, 20, 30))
    pen = ImageDraw.Draw(img)
    cell = size // GRID
    side = max(2, cell * 5 // 8)
    for colour, c in zip(colours, cells):
        slack = cell - side
        dx, dy = (jitter.randint(0, slack), jitter.randint(0, slack)) if jitter else (slack // 2, slack // 2)
        x, y = (c % GRID) * cell + dx, (c // GRID) * cell + dy
        pen.rectangle([x, y, x + side - 1, y + side - 1], fill=COLOURS[colour])
    return img


def png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


class Shapes(Task):
    """Name the squares' colour, or count them (``1..max_count``); 1 in ``eval_every`` layouts is held out."""

    class Options(Options):
        """``task.options`` of ``shapes``."""

        question: Literal["colour", "count"] = "colour"
        """``colour``: the squares share a colour, name it; ``count``: how many squares (harder to learn)."""
        max_count: int = Field(4, ge=1, le=GRID * GRID)
        """Most squares in a picture (the fewest is 1)."""
        size: int = Field(32, ge=8, le=4096)
        """The picture's side in pixels (the model's processor resizes it to what its encoder takes)."""
        eval_every: int = Field(10, ge=2, le=1_000_000)
        """One layout in this many (by a hash of its squares) is held out: the eval split."""

    def __init__(self, prompts: int, seed: int = 0, question: str = "colour", max_count: int = 4, size: int = 32,
                 eval_prompts: int = 64, eval_every: int = 10):
        self.prompts, self.seed, self.question = prompts, seed, question
        self.max_count, self.size = max_count, size
        self.eval_prompts, self.eval_every = eval_prompts, eval_every

    def _draw(self, rng: random.Random, held_out: bool) -> Prompt:
        names = sorted(COLOURS)
        while True:
            n = rng.randint(1, self.max_count)
            cells = sorted(rng.sample(range(GRID * GRID), n))
            colours = [rng.choice(names) for _ in cells] if self.question == "count" else [rng.choice(names)] * n
            key = ",".join(f"{c}{k}" for c, k in zip(cells, colours))
            if self._held_out(key) == held_out:
                img = draw(colours, cells, self.size, jitter=rng)
                target = str(n) if self.question == "count" else colours[0]
                return Prompt(f"{IMAGE_TOKEN}{self.question}:", {"target": target}, images=(png(img),))
