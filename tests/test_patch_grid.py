"""A patch-grid image-text model (Qwen2.5-VL's architecture, random weights) through the rollout and the trainer:
its 3-D rotary positions are the same on both sides, on every path the rollout samples by."""

from __future__ import annotations

import io

import pytest
from PIL import Image

import omnigraph as og
from omnigraph.sdk import Prompt, SampleBatch, Weights
from omnigraph.testing import build_node, prompts

from nodes.models import prefix, vision
from nodes.models.patch_grid import GridProcessor
from nodes.tasks.prompting import encode_pictures, picture_lengths
from nodes.zoo import grid_vl

from conftest import GRAPHS

VLM = GRAPHS / "vlm_one_step_off.yaml"
SCORE = ["nodes.update.mini_batch_size=64"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return grid_vl.build(tmp_path_factory.mktemp("grid-vl") / "qwen2.5-vl-tiny")


@pytest.fixture(scope="module")
def batch(model):
    spec = og.load(VLM, [f"model.path={model}"])
    return build_node(spec, "generate")[0].generate(0, prompts(spec, 0), Weights(0))


def scores(model, batch, *overrides):
    node, _ = build_node(og.load(VLM, [f"model.path={model}", *SCORE, *overrides]), "old_logprob")
    return node.logprobs(0, batch).fields["old_logprob"]


def gap(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max())


def png(w: int, h: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def test_its_processor_is_built_from_the_folder_without_torchvision_and_counts_each_pictures_tokens(model):
    proc = vision.processor(model)
    assert isinstance(proc, GridProcessor)
    prompt = Prompt(text="<image>and<image>colour:", images=(png(56, 56), png(120, 60)))
    ids, pix = encode_pictures(proc.tokenizer, proc, prompt)
    # a 56x56 picture is a 4x4 grid of 14-pixel patches, 2x2 merged: 4 tokens; 120x60 resizes to 112x56: 8
    assert pix["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 8]]
    assert ids.count(proc.image_token_id) == 12 and pix["pixel_values"].shape[0] == 16 + 32
    start = proc.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert ids.count(start) == 2                      # each picture in Qwen's markup
    assert picture_lengths(proc.tokenizer, proc, [prompt]) == [len(ids)]


@pytest.mark.parametrize("share", [True, False])
def test_the_trainer_scores_what_the_rollout_sampled_at_the_same_3d_positions(model, batch, share):
    assert isinstance(batch.fields["pixel_values"][0], dict)
    lp = scores(model, batch, f"nodes.old_logprob.share_prompts={str(share).lower()}")
    assert gap(lp, batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4


def test_the_positions_are_the_pictures_grids_not_the_texts(model, batch, monkeypatch):
    # scored at text positions (what the model reads without its pictures' grids), the same tokens differ
    monkeypatch.setattr(prefix, "positions", lambda model, ids, mask, pixels=None: prefix.position_ids(mask))
    from nodes.trainer import policy
    monkeypatch.setattr(policy, "positions", prefix.positions)
    assert gap(scores(model, batch), batch.fields["logprob"], batch.fields["response_mask"]) > 1e-3


def test_the_trainer_reads_the_pictures(model, batch):
    pix, k = batch.fields["pixel_values"], len(batch) // len(batch.groups)
    moved = batch.with_fields(pixel_values=pix[k:] + pix[:k], image_key=batch.fields["image_key"].roll(-k))
    assert gap(scores(model, moved), batch.fields["logprob"], batch.fields["response_mask"]) > 1e-2


def test_with_partial_rollouts_later_firings_place_the_pictures_as_the_first(model):
    # later firings continue rows that no longer repeat: generate runs them whole, told which tokens are pictures
    extra = ["nodes.generate.partial={budget_tokens: 2, max_spans: 4}", "schedule.max_staleness=4"]
    spec = og.load(VLM, [f"model.path={model}", *SCORE, *extra])
    gen, _ = build_node(spec, "generate")
    batches = [gen.generate(step, prompts(spec, step), Weights(0)) for step in range(4)]
    batch = SampleBatch.concat([b for b in batches if len(b)])
    assert max(batch.fields["spans"]) > 1
    assert gap(scores(model, batch, *extra), batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4


@pytest.mark.parametrize("share", [True, False])
def test_a_multi_turn_episode_keeps_its_pictures_positions_every_turn(model, share):
    env = "nodes.generate.env={name: copy_chain, max_turns: 2, max_tokens: 24, options: {rounds: 2}}"
    spec = og.load(VLM, [f"model.path={model}", env, *SCORE])
    gen, ctx = build_node(spec, "generate")
    batch = gen.generate(0, prompts(spec, 0), Weights(0))
    assert ctx.metrics["turns_mean"] > 1
    lp = scores(model, batch, env, f"nodes.old_logprob.share_prompts={str(share).lower()}")
    assert gap(lp, batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4


def test_after_a_lora_sync_the_rollout_samples_what_the_trainer_scores(model):
    lora = ["nodes.update.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}", "nodes.sync.payload=lora",
            "model.freeze=[vision]"]
    from test_vision import after_a_sync

    batch, old = after_a_sync(og.load(VLM, [f"model.path={model}", *SCORE, *lora]))
    assert gap(old, batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4


def test_the_chunked_head_scores_it_as_the_sampler_did(model, batch):
    from test_update_options import grad_gap, scores as update_scores

    spec = og.load(VLM, [f"model.path={model}", *SCORE])
    T, mask = batch.meta["temperature"], batch.fields["response_mask"] > 0
    lp, _, g, _ = update_scores(spec, batch, None, T)
    lp2, _, g2, _ = update_scores(spec, batch, 16, T)
    assert float((lp2 - batch.fields["logprob"])[mask].abs().max()) < 1e-4
    assert float((lp - lp2)[mask].abs().max()) < 1e-5 and grad_gap(g, g2) < 1e-4


def test_an_agent_shown_pictures_through_the_endpoint_is_scored_at_the_positions_it_sampled_at(model, monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    agent = "nodes.generate.agent={entry: 'agent_programs:looks_twice', max_tokens: 64, batch_wait_s: 2}"
    spec = og.load(VLM, [f"model.path={model}", agent, "task.prompts=4", "task.samples_per_prompt=4"])
    gen, _ = build_node(spec, "generate")
    batch = gen.generate(0, prompts(spec, 0), Weights(version=0))
    f = batch.fields
    assert gen.agents.stats["agent_requests"] == 2 * len(batch) and gen.agents.stats["retokenize_mismatch"] == 0
    assert all(len(p["image_grid_thw"]) == 2 for p in f["pixel_values"])      # the picture shown twice
    lp = scores(model, batch, "nodes.update.mini_batch_size=8")
    assert gap(lp, f["logprob"], f["response_mask"]) < 1e-4


def test_the_gpu_image_text_bench_runs_its_measurements_on_the_tiny_shape():
    import json
    import subprocess
    import sys

    from conftest import ROOT

    out = subprocess.run([sys.executable, "bench/gpu_vlm.py", "--shape", "tiny", "--device", "cpu", "--side", "112",
                          "--prompts", "2", "--new", "8", "--reps", "1", "--no-save"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["image_tokens_per_picture"] == 16 and r["encoder_images_per_s"] > 0     # 112 px: 8x8 patches, 2x2 merged
    assert r["gen_tokens_per_s"] > 0 and r["update_tokens_per_s"] > 0 and 0 < r["encoder_share"] < 1


def trained(model, batch, keep: bool, monkeypatch):
    """old_logprob then one update of ``batch`` with the tower frozen, its output kept or not."""
    from nodes.trainer import policy
    spec = og.load(VLM, [f"model.path={model}", *SCORE, "model.freeze=[vision]"])
    with monkeypatch.context() as mp:
        if not keep:
            mp.setattr(policy, "FeatureCache", lambda model: None)
        shared = {}
        scored = build_node(spec, "reward")[0].score(0, batch)
        scored = build_node(spec, "old_logprob", shared=shared)[0].logprobs(0, scored)
        upd, ctx = build_node(spec, "update", shared=shared)
        upd.train(1, scored)
    weights = {k: v.detach().clone() for k, v in upd.policy.model.named_parameters()}
    return scored.fields["old_logprob"], weights, ctx.metrics, upd.policy.features


def test_a_frozen_towers_output_is_computed_once_per_sample_and_trains_the_same_weights(model, batch, monkeypatch):
    lp, w, m, kept = trained(model, batch, True, monkeypatch)
    lp2, w2, m2, none = trained(model, batch, False, monkeypatch)
    assert none is None and kept is not None
    mask = batch.fields["response_mask"]
    assert gap(lp, lp2, mask) < 1e-5 and gap(lp, batch.fields["logprob"], mask) < 1e-4
    assert max(float((w[k] - w2[k]).abs().max()) for k in w) < 1e-5
    # old_logprob ran the tower once per distinct sample's pictures; the update took them all from what was kept
    assert kept.computed == len(set(batch.fields["image_key"].tolist())) <= kept.reused
    assert m["update_encoder_s"] == 0 < m2["update_encoder_s"]


def test_a_qwen2_vl_is_scored_as_sampled_with_its_tower_frozen_or_not(tmp_path):
    path = grid_vl.build(tmp_path / "qwen2-vl-tiny", vision=grid_vl.TINY_VISION_QWEN2, arch="qwen2_vl")
    for extra in ([], ["model.freeze=[vision]"]):
        spec = og.load(VLM, [f"model.path={path}", *SCORE, *extra])
        batch = build_node(spec, "generate")[0].generate(0, prompts(spec, 0), Weights(0))
        lp = build_node(spec, "old_logprob")[0].logprobs(0, batch).fields["old_logprob"]
        assert gap(lp, batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4, extra
