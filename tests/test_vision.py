"""Pictures in prompts: the embedded image-text model (tiny-vl) through the rollout, the trainer and a run."""

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import omnigraph as og
from omnigraph.sdk import ConfigError, SampleBatch, Weights
from omnigraph.testing import build_node, export, prompts

from nodes.tasks.shapes import Shapes

from conftest import GRAPHS, ROOT

VLM = GRAPHS / "vlm_one_step_off.yaml"
DATA = "task={{source: {}, image: image, prompt: question, answer: answer, split: train, eval_split: test}}"


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


def test_the_rollout_times_the_vision_tower_and_draws_it_in_the_timeline():
    spec = og.load(VLM)
    gen, ctx = build_node(spec, "generate")
    gen.generate(0, prompts(spec, 0), Weights(0))
    assert 0 < ctx.metrics["encoder_s"] and 0 < ctx.metrics["encoder_share"] < 1
    # the prompts' prefill (the tower in it) to the first new token: part of the firing, more than the tower
    assert ctx.metrics["encoder_s"] < ctx.metrics["prefill_s"] and ctx.metrics["prefill_share"] < 1
    (span,) = [s for s in ctx.spans if s[0] == "vision encoder"]
    assert span[2] - span[1] >= ctx.metrics["encoder_s"] > 0


def test_the_update_times_the_vision_tower_in_its_forwards(batch):
    spec = og.load(VLM, ["nodes.update.mini_batch_size=64"])
    shared = {}
    scored = build_node(spec, "reward")[0].score(0, batch)
    scored = build_node(spec, "old_logprob", shared=shared)[0].logprobs(0, scored)
    upd, ctx = build_node(spec, "update", shared=shared)
    upd.train(1, scored)
    assert 0 < ctx.metrics["update_encoder_s"] and 0 < ctx.metrics["update_encoder_share"] < 1


def after_a_sync(spec):
    """A batch sampled after a sync of weights the rollout had not seen (the language model's and the tower's,
    where they train), and the trainer's old log-probs of it."""
    shared = {}
    sync, _ = build_node(spec, "sync", shared=shared)
    with torch.no_grad():
        for p in sync.policy.model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    gen, _ = build_node(spec, "generate")
    gen.load_weights(export(spec, sync, 1))
    batch = gen.generate(0, prompts(spec, 0), Weights(version=1))
    return batch, build_node(spec, "old_logprob", shared=shared)[0].logprobs(0, batch).fields["old_logprob"]


@pytest.mark.parametrize("payload", ["full", "lora"])
def test_after_a_sync_the_rollout_samples_what_the_trainer_scores(payload):
    lora = ["nodes.update.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"] if payload == "lora" else []
    spec = og.load(VLM, ["nodes.update.mini_batch_size=64", f"nodes.sync.payload={payload}", *lora])
    batch, old = after_a_sync(spec)
    assert gap(old, batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4
    before = build_node(og.load(VLM), "generate")[0].generate(0, prompts(spec, 0), Weights(version=0))
    assert not torch.equal(before.fields["logprob"], batch.fields["logprob"])       # the sync changed the rollout


@pytest.mark.parametrize("lora", [False, True])
def test_a_frozen_vision_tower_stays_as_it_was_and_the_rest_learns(batch, lora):
    from nodes.models.vision import tower
    adapters = ["nodes.update.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}",
                "nodes.sync.payload=lora"] if lora else []
    spec = og.load(VLM, ["nodes.update.mini_batch_size=64", "model.freeze=[vision]", *adapters])
    shared = {}
    scored = build_node(spec, "reward")[0].score(0, batch)
    scored = build_node(spec, "old_logprob", shared=shared)[0].logprobs(0, scored)
    upd, _ = build_node(spec, "update", shared=shared)
    model = upd.policy.model
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    upd.train(1, scored)
    inside = {n for n, p in model.named_parameters() if any(p is q for q in tower(model).parameters())}
    moved = {k for k, v in model.named_parameters() if not torch.equal(before[k], v.detach())}
    assert inside and not moved & inside and moved


def test_freezing_a_tower_a_model_does_not_have_is_refused():
    spec = og.load(GRAPHS / "grpo_one_step_off.yaml", ["model.freeze=[vision]"])
    with pytest.raises(ConfigError, match="no vision tower to freeze") as e:
        build_node(spec, "update")
    assert e.value.where == "model.freeze"


def test_with_partial_rollouts_a_prompt_keeps_its_pictures_across_firings():
    spec = og.load(VLM, ["nodes.generate.partial={budget_tokens: 2, max_spans: 4}", "schedule.max_staleness=4",
                         "nodes.update.mini_batch_size=64"])
    gen, ctx = build_node(spec, "generate")
    batches = []
    for step in range(4):                   # the last firing (max_spans) ends every group begun in the first
        batches.append(gen.generate(step, prompts(spec, step), Weights(0)))
        if step == 0:
            assert ctx.metrics["carried_groups_out"] > 0         # colour names are longer than one firing's budget
    batch = SampleBatch.concat([b for b in batches if len(b)])
    assert max(batch.fields["spans"]) > 1 and len(batch.fields["pixel_values"]) == len(batch)
    old = build_node(spec, "old_logprob")[0].logprobs(0, batch).fields["old_logprob"]
    assert gap(old, batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4


def test_the_image_placeholder_is_never_sampled_even_where_the_policy_favours_it():
    from nodes.models.vision import placeholder_ids
    spec = og.load(VLM, ["nodes.update.mini_batch_size=64"])
    shared = {}
    sync, _ = build_node(spec, "sync", shared=shared)
    model = sync.policy.model
    (image,) = placeholder_ids(model)
    gen, _ = build_node(spec, "generate")
    seen = gen.generate(0, prompts(spec, 0), Weights(version=0)).fields
    with torch.no_grad():          # <image>'s output row along the mean final hidden state: it wins every step
        h = model(input_ids=seen["input_ids"], attention_mask=seen["attention_mask"], output_hidden_states=True,
                  pixel_values=torch.cat(seen["pixel_values"])).hidden_states[-1].flatten(0, 1).mean(0)
        model.get_output_embeddings().weight[image] = 50 * h / h.norm()
    gen.load_weights(export(spec, sync, 1))
    batch = gen.generate(0, prompts(spec, 0), Weights(version=1))
    P = batch.meta["prompt_len"]
    assert not (batch.fields["input_ids"][:, P:] == image).any()
    old = old_logprob_with(spec, shared, batch, share=False)          # the whole rows through the tower: no stray
    assert gap(old, batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4


def old_logprob_with(spec, shared, batch, share: bool):
    node = build_node(og.load(VLM, ["nodes.update.mini_batch_size=64",
                                    f"nodes.old_logprob.share_prompts={str(share).lower()}"]), "old_logprob",
                      shared=shared)[0]
    return node.logprobs(0, batch).fields["old_logprob"]


@pytest.mark.parametrize("share", [True, False])
def test_a_multi_turn_episode_reads_its_pictures_every_turn(share):
    env = "nodes.generate.env={name: copy_chain, max_turns: 2, max_tokens: 24, options: {rounds: 2}}"
    spec = og.load(VLM, [env, "nodes.update.mini_batch_size=64"])
    gen, ctx = build_node(spec, "generate")
    batch = gen.generate(0, prompts(spec, 0), Weights(0))
    assert ctx.metrics["turns_mean"] > 1 and len(batch.fields["pixel_values"]) == len(batch)
    lp = old_logprob(batch, f"nodes.old_logprob.share_prompts={str(share).lower()}", env)
    assert gap(lp, batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4


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


def picture_data(tmp_path: Path) -> Path:
    """A folder of pictures and the JSONL of questions about them, as scripts/make_picture_data.py writes it."""
    spec = importlib.util.spec_from_file_location("make_picture_data", ROOT / "scripts" / "make_picture_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write(tmp_path / "shapes", train=32, test=8)


def test_rows_with_picture_paths_reach_the_model_and_the_trainer(tmp_path):
    spec = og.load(VLM, [DATA.format(picture_data(tmp_path))])
    shown = prompts(spec, 0)
    drawn = {p.images for p in Shapes(prompts=32, seed=0).batch(0)}     # what the script wrote, as files
    assert {p.images for p in shown} <= drawn
    assert all(p.text == "<image>colour:" and len(p.images) == 1 and "image" not in p.meta["data"] for p in shown)
    gen, _ = build_node(spec, "generate")
    batch = gen.generate(0, shown, Weights(0))
    assert gap(old_logprob(batch), batch.fields["logprob"], batch.fields["response_mask"]) < 1e-4


@pytest.mark.parametrize("form", ["parquet", "saved"])
def test_parquet_paths_and_a_saved_dataset_with_an_image_column_give_the_same_prompts(tmp_path, form):
    import datasets
    src = picture_data(tmp_path)
    out = tmp_path / form
    out.mkdir()
    if form == "parquet":            # paths relative to the parquet files' folder
        (out / "images").symlink_to(src / "images")
    for split in ("train", "test"):
        rows = [json.loads(line) for line in (src / f"{split}.jsonl").read_text().splitlines()]
        if form == "parquet":
            datasets.Dataset.from_list(rows).to_parquet(str(out / f"{split}.parquet"))
            continue
        for r in rows:               # the pictures themselves, in an Image column
            r["image"] = str(src / r["image"])
        ds = datasets.Dataset.from_list(rows).cast_column("image", datasets.Image())
        ds.save_to_disk(str(out / split))
    if form == "saved":
        datasets.DatasetDict({k: datasets.load_from_disk(str(out / k)) for k in ("train", "test")}).save_to_disk(
            str(out / "all"))
        out = out / "all"
    want = [(p.text, p.images) for p in prompts(og.load(VLM, [DATA.format(src)]), 0)]
    got = [(p.text, p.images) for p in prompts(og.load(VLM, [DATA.format(out)]), 0)]
    assert [t for t, _ in got] == [t for t, _ in want] and all(len(i) == 1 for _, i in got)
    from nodes.models.vision import open_images
    pixels = lambda pairs: [list(open_images(i)[0].getdata()) for _, i in pairs]  # noqa: E731
    assert pixels(got) == pixels(want)           # the same pictures (re-encoded where datasets stored them)


def test_a_prompt_limit_counts_the_tokens_each_picture_expands_to(tmp_path):
    from omnigraph import plugins
    from nodes.tasks.prompting import encode_pictures, picture_lengths
    src = picture_data(tmp_path)
    gen, _ = build_node(og.load(VLM), "generate")
    shown = prompts(og.load(VLM, [DATA.format(src)]), 0)
    assert picture_lengths(gen.tok, gen.processor, shown) == [len(encode_pictures(gen.tok, gen.processor, p)[0])
                                                             for p in shown] == [24] * len(shown)
    over = DATA.format(src).replace("}", ", max_prompt_tokens: 20, on_long: error}")
    with pytest.raises(og.GraphError, match=r"longer than max_prompt_tokens = 20 \(row 0: 24 tokens\)"):
        plugins.make_task(og.load(VLM, [over]))


def damage(path: Path, how: str) -> None:
    from PIL import Image
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:60])
    elif how == "text":
        path.write_text("not a picture")
    else:                                        # larger than the default task.max_image_pixels (4096 x 4096)
        Image.new("RGB", (5000, 4000)).save(path)


@pytest.mark.parametrize("how, message", [("missing", "does not exist"), ("truncated", "truncated"),
                                          ("text", "not in a picture format"), ("huge", "over task.max_image_pixels")])
def test_a_bad_picture_is_one_line_naming_its_row_and_file_before_training(tmp_path, how, message):
    src = picture_data(tmp_path)
    damage(src / "images" / "train-0003.png", how)
    exe = Path(sys.executable).parent / "omnigraph"
    p = subprocess.run([str(exe), "check", str(VLM), DATA.format(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert "row 3 (id 'train-0003')" in p.stderr and "images/train-0003.png" in p.stderr and message in p.stderr


@pytest.mark.slow
def test_an_image_text_policy_learns_to_name_the_colour(tmp_path):
    exe = [sys.executable, "-m", "omnigraph.cli", "run", str(VLM), "--run-dir", str(tmp_path), "--quiet",
           "schedule.iterations=20", "nodes.generate.eval_every=19"]
    out = subprocess.run(exe, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in next(tmp_path.glob("*/metrics.jsonl")).read_text().splitlines()]
    evals = [r["eval_reward"] for r in rows if r.get("eval_reward") is not None]
    assert evals[-1] >= evals[0] + 0.3, evals


def test_the_what_if_table_says_where_the_pictures_time_goes(tmp_path, capsys):
    from omnigraph.cli import main

    assert main(["run", str(VLM), "schedule.iterations=5", "nodes.generate.eval_every=0", "--executor", "local",
                 "--quiet", "--run-dir", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    capsys.readouterr()
    assert main(["plan", "--timings", str(run)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("pictures:"))
    assert "the vision tower" in line and "prefill" in line and "in the update" in line, line
    assert main(["plan", "--timings", str(run), "--json"]) == 0
    shares = json.loads(capsys.readouterr().out)["shares"]
    assert set(shares) == {"encoder_share", "prefill_share", "update_encoder_share"}
    assert 0 < shares["encoder_share"] < shares["prefill_share"] < 1, shares
    # the trainer's rate, and its MFU where the update logged one (on a GPU: here added to the run's rows)
    assert main(["plan", "--timings", str(run), "--json"]) == 0
    trainer = json.loads(capsys.readouterr().out)["trainer"]
    assert set(trainer) == {"update_tokens_per_s"} and trainer["update_tokens_per_s"] > 0
    metrics = run / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps({**r, "mfu": 0.41} if "update_tokens_per_s" in r else r) + "\n"
                               for r in rows))
    assert main(["plan", "--timings", str(run)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("trainer:"))
    assert "update tokens/s" in line and "MFU 41.0%" in line, line


def test_a_frozen_towers_output_is_kept_and_the_projector_still_trains(batch, monkeypatch):
    from test_patch_grid import trained
    lp, w, m, kept = trained("tiny-vl", batch, True, monkeypatch)
    lp2, w2, m2, none = trained("tiny-vl", batch, False, monkeypatch)
    mask = batch.fields["response_mask"]
    assert none is None and kept is not None and kept.computed == len(set(batch.fields["image_key"].tolist()))
    assert gap(lp, lp2, mask) < 1e-5 and gap(lp, batch.fields["logprob"], mask) < 1e-4
    assert max(float((w[k] - w2[k]).abs().max()) for k in w) < 1e-5
    assert m["update_encoder_s"] == 0 < m2["update_encoder_s"]            # the update ran no tower
    start = dict(build_node(og.load(VLM), "update", shared={})[0].policy.model.named_parameters())
    projector = [k for k in w if "multi_modal_projector" in k]
    assert projector and all(not torch.equal(w[k], start[k].detach()) for k in projector)    # it trained
