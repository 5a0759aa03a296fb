"""Agent programs with pictures: the task's pictures as OpenAI image parts through the endpoint, the
trajectory's pixels for the trainer, the endpoint's refusals, and a run that trains."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import omnigraph as og
from omnigraph.sdk import Weights
from omnigraph.testing import build_node, prompts

from nodes.rollout import agent_pictures

from conftest import GRAPHS

HERE = Path(__file__).resolve().parent
VLM = GRAPHS / "vlm_one_step_off.yaml"


@pytest.fixture(autouse=True)
def _programs_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def generator(agent: str, *extra: str):
    spec = og.load(VLM, [f"nodes.generate.agent={agent}", "task.prompts=4", "task.samples_per_prompt=4", *extra])
    gen, _ = build_node(spec, "generate")
    torch.manual_seed(0)
    return spec, gen, gen.generate(0, prompts(spec, 0), Weights(version=0))


def scored(spec, batch):
    lp, _ = build_node(og.load(VLM, ["nodes.update.mini_batch_size=8"]), "old_logprob")     # not fused
    return lp.logprobs(0, batch).fields["old_logprob"]


def test_an_agent_shows_the_picture_twice_and_the_trainer_scores_exactly_what_it_sampled():
    spec, gen, batch = generator("{entry: 'agent_programs:looks_twice', max_tokens: 64, batch_wait_s: 2}")
    agents, f = gen.agents, batch.fields
    assert agents.stats["agent_requests"] == 2 * len(batch) and agents.stats["retokenize_mismatch"] == 0
    assert all(m["episode"]["status"] == "done" for m in f["meta"]), [m["episode"] for m in f["meta"]]
    # each sample: its prompt's picture, then the same picture shown again in the second turn
    assert [tuple(p.shape) for p in f["pixel_values"]] == [(2, 3, 32, 32)] * len(batch)
    assert all(torch.equal(p[0], p[1]) for p in f["pixel_values"])
    image = gen.tok.convert_tokens_to_ids("<image>")
    assert all(int((row == image).sum()) == 32 for row in f["input_ids"])          # 16 image tokens a picture
    mask = f["response_mask"]
    lp = scored(spec, batch)
    assert float(((lp - f["logprob"]).abs() * mask).max()) < 1e-4
    # the trainer reads the pictures: the same tokens with another group's pictures score otherwise
    k = spec.task.samples_per_prompt
    moved = batch.with_fields(pixel_values=f["pixel_values"][k:] + f["pixel_values"][:k],
                              image_key=f["image_key"].roll(-k))
    assert float(((scored(spec, moved) - f["logprob"]).abs() * mask).max()) > 0.1


def test_the_endpoint_refuses_image_parts_it_cannot_read_in_openais_shape():
    spec, gen, batch = generator("{entry: 'agent_programs:picture_probes', max_tokens: 64}", "task.prompts=1",
                                 "task.samples_per_prompt=1")
    (e,) = [m["episode"] for m in batch.fields["meta"]]
    seen = e["info"]
    assert e["status"] == "done", e
    assert seen["remote"] == [400, "messages[0].content[0]"], seen
    assert seen["not_base64"] == [400, "messages[0].content[0]"], seen
    assert seen["not_a_picture"] == [400, "messages[0].content[0]"], seen
    assert seen["audio"] == [400, "messages[0].content[0]"], seen
    assert seen["typed_placeholder"] == [400, "messages"], seen


def test_a_text_policy_refuses_image_parts():
    from test_agents import generator as text_generator

    spec, gen, _ = text_generator("{entry: 'agent_programs:picture_probes', max_tokens: 64}", "task.prompts=1",
                                  "task.samples_per_prompt=1")
    # the task's rows carry a picture the policy cannot read; the agent sends it anyway
    shown = [replace(p, images=(agent_pictures.PNG,)) for p in prompts(spec, 0)]
    torch.manual_seed(0)
    batch = gen.generate(0, shown, Weights(version=0))
    seen = batch.fields["meta"][0]["episode"]["info"]
    assert seen["remote"] == seen["typed_placeholder"] == [400, "messages[0].content[0]"], seen


@pytest.mark.slow
def test_an_agent_shown_the_picture_learns_to_name_the_colour(tmp_path):
    exe = [sys.executable, "-m", "omnigraph.cli", "run", str(VLM), "--run-dir", str(tmp_path), "--quiet",
           "schedule.iterations=20", "nodes.generate.eval_every=19",
           f"nodes.generate.agent={{entry: '{HERE / 'agent_programs.py'}:names_colour', max_tokens: 16}}"]
    out = subprocess.run(exe, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in next(tmp_path.glob("*/metrics.jsonl")).read_text().splitlines()]
    assert all(r.get("agent_errors", 0) == 0 and r.get("retokenize_mismatch", 0) == 0 for r in rows)
    evals = [r["eval_reward"] for r in rows if r.get("eval_reward") is not None]
    assert evals[-1] >= evals[0] + 0.3, evals


def test_a_context_that_ends_in_a_picture_is_sampled_with_all_its_image_tokens():
    # an agent's turn can end with a picture (tiny-vl's template adds nothing after the user's turn): rows that
    # repeat such a context are not prefilled without their last token, which is an image token
    spec = og.load(VLM)
    gen, _ = build_node(spec, "generate")
    p = prompts(spec, 0)[0]
    ids, pix = gen.encode_all([replace(p, text="colour:<image>")])
    assert ids[0][-1] == gen.tok.convert_tokens_to_ids("<image>")
    many = gen.sample(ids * 4, 1, greedy=True, seed=0, pixels=pix * 4)
    one = gen.sample(ids, 1, greedy=True, seed=0, pixels=pix)
    assert many["completion"] == one["completion"] * 4


def test_a_picture_that_does_not_fit_the_episodes_budget_is_left_out_with_its_tokens():
    # 24 columns: the first reply, then "again" and a picture of 16 tokens that would leave no column for a reply
    spec, gen, batch = generator("{entry: 'agent_programs:looks_twice', max_tokens: 24, batch_wait_s: 2}")
    f, image = batch.fields, gen.tok.convert_tokens_to_ids("<image>")
    for row, pix in zip(f["input_ids"], f["pixel_values"]):
        assert int((row == image).sum()) == 16 * len(pix)
    # each row keeps the second picture exactly where the first reply left room for "again", its 16 tokens and
    # one column after them
    again = len(gen.tok("again", add_special_tokens=False).input_ids)
    for mask, pix in zip(f["response_mask"], f["pixel_values"]):
        first = int(mask.tolist().index(0)) if 0 in mask.tolist() else len(mask)      # the first reply's tokens
        assert len(pix) == (2 if first + again + 16 < 24 else 1), (first, len(pix))
    # not vacuous: at least one row had its second picture left out, so the check above saw a cut
    assert 1 in {len(p) for p in f["pixel_values"]}
    lp = scored(spec, batch)
    assert float(((lp - f["logprob"]).abs() * f["response_mask"]).max()) < 1e-4
