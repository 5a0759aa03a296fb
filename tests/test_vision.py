"""Pictures in prompts: the embedded image-text model (tiny-vl) through the rollout, the trainer and a run."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

import omnigraph as og
from omnigraph.sdk import ConfigError, Weights
from omnigraph.testing import build_node, prompts

from conftest import GRAPHS

VLM = GRAPHS / "vlm_one_step_off.yaml"


@pytest.fixture(scope="module")
def batch():
    spec = og.load(VLM)
    gen, _ = build_node(spec, "generate")
    return gen.generate(0, prompts(spec, 0), Weights(0))


def old_logprob(batch, *overrides):
    lp, _ = build_node(og.load(VLM, ["nodes.update.mini_batch_size=64", *overrides]), "old_logprob")
    return lp.logprobs(0, batch).fields["old_logprob"]


def gap(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max())


@pytest.mark.parametrize("share", [True, False])
def test_the_trainer_scores_what_the_rollout_sampled_from_the_same_pictures(batch, share):
    # every prompt has the same text, "<image>colour:": rows are one prompt only where their pictures are the same
    assert len(set(batch.fields["prompt"])) == 1 and len(batch.fields["pixel_values"]) == len(batch)
    assert len(set(batch.fields["image_key"].tolist())) == len(batch.groups)
    lp = old_logprob(batch, f"nodes.old_logprob.share_prompts={str(share).lower()}")
    assert gap(lp, batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4


def test_the_trainer_reads_the_pictures(batch):
    # the same tokens scored with each group's pictures moved to the next group: other log-probs
    pix = batch.fields["pixel_values"]
    k = len(batch) // len(batch.groups)
    moved = batch.with_fields(pixel_values=pix[k:] + pix[:k], image_key=batch.fields["image_key"].roll(-k))
    lp = old_logprob(moved)
    assert gap(lp, batch.fields["logprob"], batch.fields["response_mask"]) > 0.1


def test_pictures_for_a_model_that_takes_none_say_so():
    spec = og.load(GRAPHS / "grpo_one_step_off.yaml")
    gen, _ = build_node(spec, "generate")
    shown = [replace(p, images=q.images) for p, q in zip(prompts(spec, 0), prompts(og.load(VLM), 0))]
    with pytest.raises(ConfigError, match="takes none") as e:
        gen.generate(0, shown, Weights(0))
    assert e.value.where == "model.path"


def test_a_prompt_whose_picture_is_not_an_image_names_it():
    spec = og.load(VLM)
    gen, _ = build_node(spec, "generate")
    bad = prompts(spec, 0)
    bad[1] = replace(bad[1], images=(b"\x89PNG\r\n\x1a\n truncated",))
    with pytest.raises(ValueError, match="picture 0 is not an image"):
        gen.generate(0, bad, Weights(0))


@pytest.mark.slow
def test_an_image_text_policy_learns_to_name_the_colour(tmp_path):
    exe = [sys.executable, "-m", "omnigraph.cli", "run", str(VLM), "--run-dir", str(tmp_path), "--quiet",
           "schedule.iterations=20", "nodes.generate.eval_every=19"]
    out = subprocess.run(exe, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in next(tmp_path.glob("*/metrics.jsonl")).read_text().splitlines()]
    evals = [r["eval_reward"] for r in rows if r.get("eval_reward") is not None]
    assert evals[-1] >= evals[0] + 0.3, evals
