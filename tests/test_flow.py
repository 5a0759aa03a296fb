"""FlowGRPO nodes (``nodes.diffusion.flow``, ``nodes.diffusion.flowgrpo``) and the rollout actor's ordering rule
(``omnigraph.planning.order``): a finished batch leaves before the next generation, in every schedule."""

import itertools
import subprocess
from pathlib import Path

import pytest
import torch

import omnigraph as og
from omnigraph.planning.order import queued_transfers
from omnigraph.graph.spec import GraphSpec
from omnigraph.testing import build_node, canonical_spec, export, prompts

from cli_process import EXE
from conftest import GRAPHS

SYNC, ASYNC = GRAPHS / "flowgrpo_sync.yaml", GRAPHS / "flowgrpo_async.yaml"


# ---------------------------------------------------------------- the sampler's log-probabilities


def test_sde_logprobs_are_the_gaussian_transitions_and_recompute_exactly():
    from nodes.diffusion import flow
    torch.manual_seed(0)
    net = flow.VelocityNet(channels=8, emb=16).eval()
    ts = flow.timesteps(6)
    out = flow.sample(net, torch.randn(4, 3, 8, 8), ts, 0.7, torch.Generator().manual_seed(1))
    lat = out["latents"]
    # every transition's logprob is that of N(step_mean, std^2) at the next latent, averaged over the values
    for k in range(6):
        with torch.no_grad():
            mean = flow.step_mean(lat[:, k], net(lat[:, k], ts[k].expand(4)), ts, k, 0.7)
        std = flow.noise_std(ts, k, 0.7)
        ref = torch.distributions.Normal(mean, std).log_prob(lat[:, k + 1]).flatten(1).mean(1)
        assert torch.allclose(out["logprob"][:, k], ref, atol=1e-5)
    # the trainer's recomputation (same batch, same steps) is the sampler's to the bit
    with torch.no_grad():
        again = flow.transition_logprobs(net, lat, ts, 0.7, list(range(6)))
    assert torch.equal(again, out["logprob"])
    # and it carries gradients to the weights
    lp = flow.transition_logprobs(net.train(), lat, ts, 0.7, [2])
    lp.sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_centred_reward_favours_a_centred_disc_over_noise_and_off_centre_discs():
    from nodes.diffusion.flowgrpo import centred
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")

    def disc(cx, cy, r=3.0):
        return (((xx - cx) ** 2 + (yy - cy) ** 2 <= r * r).float() * 2 - 1).expand(3, 16, 16)

    middle, edge, corner = centred(torch.stack([disc(7.5, 7.5), disc(7.5, 2.5), disc(2.5, 2.5)]))
    noise, light = centred(torch.stack([torch.rand(3, 16, 16) * 2 - 1, torch.ones(3, 16, 16)]))
    assert middle > 0.95 and middle > edge > corner
    assert max(noise, light) < 0.3


# ---------------------------------------------------------------- the nodes, one step by hand


def test_generate_score_update_sync_round_trip_on_the_embedded_model(tmp_path):
    spec = og.load(SYNC, ["task.prompts=2", "task.samples_per_prompt=4"])
    gen, _ = build_node(spec, "generate")
    shared: dict = {}
    reward, _ = build_node(spec, "reward")
    old, _ = build_node(spec, "old_logprob", shared=shared)
    upd, uctx = build_node(spec, "update", shared=shared)
    sync, _ = build_node(spec, "sync", shared=shared)
    w0 = export(spec, sync, 0)
    batch = gen.generate(0, prompts(spec, 0), w0)
    assert batch.fields["latents"].shape == (8, 11, 3, 16, 16) and batch.fields["logprob"].shape == (8, 10)
    assert batch.group_ids == [0] * 4 + [1] * 4 and batch.min_version == [0] * 8
    again = gen.generate(0, prompts(spec, 0), w0)      # a regenerated batch: the same pictures
    assert torch.equal(again.fields["latents"], batch.fields["latents"])
    scored = reward.score(0, batch)
    assert len(scored.fields["reward"]) == 8 and abs(sum(scored.fields["advantage"][:4])) < 1e-4
    before = {k: v.clone() for k, v in upd.policy.net.state_dict().items()}
    upd.train(0, old.logprobs(0, scored))
    assert uctx.metrics["behav_ratio_dev_max"] <= 1e-4          # on policy: trainer == sampler
    assert any(not torch.equal(before[k], v) for k, v in upd.policy.net.state_dict().items())
    gen.load_weights(export(spec, sync, 1))                     # the generator now samples the new weights
    assert all(torch.equal(a, b) for a, b in zip(gen.net.state_dict().values(), upd.policy.net.state_dict().values()))
    gen.save(str(tmp_path))
    assert {p.name for p in tmp_path.iterdir()} == {"samples_first.png", "samples_last.png"}


LORA = ["nodes.update.lora={r: 4, alpha: 8, target_modules: [conv1, conv2]}", "nodes.sync.payload=lora"]


def test_lora_adapters_train_and_reach_the_generator_alone(tmp_path):
    spec = og.load(SYNC, ["task.prompts=2", "task.samples_per_prompt=4", *LORA])
    gen, _ = build_node(spec, "generate")
    shared: dict = {}
    reward, _ = build_node(spec, "reward")
    upd, _ = build_node(spec, "update", shared=shared)
    sync, _ = build_node(spec, "sync", shared=shared)
    base = {k: v.clone() for k, v in upd.policy.net.state_dict().items() if "lora_" not in k}
    batch = reward.score(0, gen.generate(0, prompts(spec, 0), export(spec, sync, 0)))
    batch.meta["old_logprob"] = "fused"
    upd.train(0, batch)
    after = upd.policy.net.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in base.items())         # only the adapters moved
    w = export(spec, sync, 1)
    assert w.payload == "lora" and w.tensors and all("lora_" in k for k in w.tensors)
    gen.load_weights(w)
    x, t = torch.randn(2, 3, 16, 16), torch.full((2,), 0.5)
    with torch.no_grad():
        assert torch.equal(gen.net(x, t), upd.policy.net.eval()(x, t))    # the generator serves the new adapters
    upd.save(str(tmp_path))
    assert (tmp_path / "final" / "model.safetensors").exists() and (tmp_path / "final" / "adapter").is_dir()


def test_lora_target_modules_that_name_nothing_get_a_clear_error():
    spec = og.load(SYNC, ["nodes.update.lora={r: 4, target_modules: [q_proj]}", "nodes.sync.payload=lora"])
    with pytest.raises(Exception, match="target_modules .* do not fit the image model"):
        build_node(spec, "update")


# ---------------------------------------------------------------- the graphs and their checks


def test_async_graph_proves_its_bound_and_shows_the_transfer_before_the_next_generate():
    plan = og.compile(ASYNC)
    assert plan.bound == 5
    assert [t.label for t in plan.order["rollout.0"]][:2] == ["generate", "reward"]
    assert "generate -> reward [-> trainer.0] -> apply sync->generate.weights" in str(plan)
    assert og.compile(SYNC).bound == 0


@pytest.mark.parametrize("override, field, words", [
    ("nodes.generate.eval_every=5", "nodes.generate.eval_every", "no greedy evaluation"),
    ("nodes.generate.options.stepz=3", "nodes.generate.options.stepz", "unknown generate backend flow option 'stepz' (did you mean 'steps'?"),
    ("nodes.reward.fn=nodes.diffusion.flowgrpo:nowhere", "nodes.reward.fn", ""),
])
def test_check_names_the_field_of_a_bad_flow_graph(override, field, words):
    out = subprocess.run([EXE, "check", str(SYNC), override], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout
    assert field in out.stdout + out.stderr and words in out.stdout + out.stderr


# ---------------------------------------------------------------- the ordering rule, every schedule


def schedules():
    for mode, ahead, every, colocate in itertools.product(("sync", "one_step_off", "async"), (1, 2, 3), (1, 2, 4),
                                                          (False, True)):
        if mode != "async" and ahead > 1:
            continue
        yield canonical_spec(mode, ahead=ahead if mode == "async" else None, sync_every=every, colocate=colocate)
    for path in sorted(Path(GRAPHS).glob("*.yaml")):
        yield og.load(path)


def test_no_schedule_puts_a_transfer_behind_a_queued_generation():
    specs = list(schedules())
    assert len(specs) > 20
    for spec in specs:
        assert queued_transfers(og.compile(spec)) == [], spec.name


def test_a_delay_inside_the_rollout_actor_is_caught_and_named():
    raw = canonical_spec("one_step_off").model_dump(mode="json")
    raw["schedule"]["mode"] = "custom"
    raw["edges"] = [{"generate -> reward": {"delay": 1}}, "reward -> old_logprob", "old_logprob -> update",
                    "update -> sync", {"sync -> generate": {"delay": 1}}]
    plan = og.compile(GraphSpec.model_validate(raw))
    problems = queued_transfers(plan)
    assert len(problems) == 1 and "rollout.0 sends reward's output" in problems[0]
    assert "move it to the edge reward -> old_logprob" in problems[0]
    assert problems[0] in plan.warnings


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_flowgrpo_learns_on_policy_with_a_ratio_of_one_and_saves_pictures():
    res = og.run(og.compile(SYNC, overrides=["schedule.iterations=24", "checkpoint.every=null"]), progress=False)
    rows = [r for r in res.metrics if "reward_mean" in r]
    first = sum(r["reward_mean"] for r in rows[:5]) / 5
    last = sum(r["reward_mean"] for r in rows[-5:]) / 5
    assert last > first + 0.03, (first, last)
    assert max(r["behav_ratio_dev_max"] for r in res.metrics if "behav_ratio_dev_max" in r) <= 1e-4
    assert (res.run_dir / "samples_first.png").stat().st_size > 0 and (res.run_dir / "samples_last.png").exists()
    assert (res.run_dir / "final" / "model.safetensors").exists()


@pytest.mark.slow
def test_flowgrpo_async_stays_within_its_bound_and_overlaps():
    res = og.run(og.compile(ASYNC, overrides=["schedule.iterations=16", "checkpoint.every=null"]), progress=False)
    assert res.summary["observed_max_staleness"] == 5 and res.summary["groups_lost"] == 0
    assert res.summary["groups_trained"] == 16 * 8
