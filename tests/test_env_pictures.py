"""Pictures an environment shows in a multi-turn episode: expanded into the model's image tokens, read by every
later turn and by the trainer, for LLaVA (tiny-vl) and a patch-grid model (Qwen2.5-VL's architecture)."""

from __future__ import annotations

from pathlib import Path

import pytest

import omnigraph as og
from omnigraph.sdk import EnvStep, Environment, Weights
from omnigraph.testing import build_node, prompts

from nodes.zoo import grid_vl

from conftest import GRAPHS

HERE = Path(__file__).resolve().parent
VLM = GRAPHS / "vlm_one_step_off.yaml"


class LookAgain(Environment):
    """After the model's first answer, the prompt's picture again: ``<image>look again, colour:``."""

    def __init__(self, prompt, **_):
        self.prompt, self.shown = prompt, 0

    async def step(self, message: str) -> EnvStep:
        self.shown += 1
        if self.shown > 1:
            return EnvStep(reward=float(message.strip() == self.prompt.meta.get("answer")), done=True)
        return EnvStep(observation="<image>look again, colour:", images=[self.prompt.images[0]])


class NotAPicture(LookAgain):
    async def step(self, message: str) -> EnvStep:
        return EnvStep(observation="look:", images=[b"not a picture"])


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return grid_vl.build(tmp_path_factory.mktemp("grid-vl") / "qwen2.5-vl-tiny")


def episodes(model: str, env: str = "LookAgain", max_tokens: int = 64):
    over = [f"model.path={model}", "nodes.update.mini_batch_size=16", "task.prompts=4",
            f"nodes.generate.env={{name: 'test_env_pictures:{env}', max_turns: 2, max_tokens: {max_tokens}}}"]
    spec = og.load(VLM, over)
    gen, _ = build_node(spec, "generate")
    return spec, gen, gen.generate(0, prompts(spec, 0), Weights(0))


@pytest.mark.parametrize("kind", ["tiny-vl", "grid"])
def test_a_picture_the_environment_shows_is_read_by_the_next_turn_and_the_trainer(kind, grid):
    model = str(grid) if kind == "grid" else kind
    spec, gen, batch = episodes(model)
    f = batch.fields
    image = gen.processor.image_token_id if kind == "grid" else gen.tok.convert_tokens_to_ids("<image>")
    P = batch.meta["prompt_len"]
    shown = [int((row[P:] == image).sum()) for row in f["input_ids"]]
    first = int((f["input_ids"][0, :P] == image).sum())
    assert all(n == first for n in shown), shown          # the environment's picture, whole, after the prompt's
    assert all(len(vision_items(p)) == 2 for p in f["pixel_values"])
    lp = build_node(spec, "old_logprob")[0].logprobs(0, batch).fields["old_logprob"]
    mask = f["response_mask"]
    assert float(((lp - f["logprob"]).abs() * mask).max()) < 1e-4
    k = len(batch) // len(batch.groups)           # the same tokens, another group's pictures: other log-probs
    moved = batch.with_fields(pixel_values=f["pixel_values"][k:] + f["pixel_values"][:k],
                              image_key=f["image_key"].roll(-k))
    lp2 = build_node(spec, "old_logprob")[0].logprobs(0, moved).fields["old_logprob"]
    assert float(((lp2 - f["logprob"]).abs() * mask).max()) > 1e-2


def vision_items(p) -> list:
    """The pictures in one sample's pixel inputs."""
    return list(p["image_grid_thw"]) if isinstance(p, dict) else list(p)


def test_a_picture_that_does_not_fit_the_episode_ends_it_unshown():
    _, _, batch = episodes("tiny-vl", max_tokens=24)        # 16 image tokens do not fit after the answer
    assert all(len(p) == 1 for p in batch.fields["pixel_values"])
    assert all(m["episode"]["truncated"] for m in batch.fields["meta"])


def test_an_observation_that_is_not_a_picture_names_the_environment():
    with pytest.raises(Exception, match="NotAPicture.*observation: picture 0 is not an image"):
        episodes("tiny-vl", env="NotAPicture")
