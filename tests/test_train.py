"""Real training nodes on the embedded tiny model: weight sync, and a short run that learns."""

import os

import pytest
import torch

import omnigraph as og
from omnigraph.runtime import run
from omnigraph.sdk import Weights
from omnigraph.testing import build_node, export, initial_reward, prompts

from conftest import GRAPHS

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def nodes_for(overrides):
    """The sync node (on the trainer: it owns the policy) and the generate node of the main graph."""
    spec = og.load(GRAPHS / "grpo_one_step_off.yaml", overrides)
    shared = {}
    sync, _ = build_node(spec, "sync", shared=shared)
    gen, _ = build_node(spec, "generate")
    return spec, sync, gen, shared


def trainer_node(spec, name, shared):
    return build_node(spec, name, shared=shared)[0]


class TestWeightSync:
    def test_lora_sync_ships_only_adapters_and_leaves_base_weights_alone(self):
        from peft import get_peft_model_state_dict
        spec, sync, gen, _ = nodes_for(["nodes.update.lora={r: 4, alpha: 8}", "nodes.sync.payload=lora"])
        trainer_model = sync.policy.model
        with torch.no_grad():
            for name, p in trainer_model.named_parameters():
                if "lora_B" in name:
                    p.add_(torch.randn_like(p))
        base_before = {k: v.clone() for k, v in gen.model.state_dict().items() if "lora_" not in k}
        w = export(spec, sync, 1)
        assert w.payload == "lora" and all("lora_" in k for k in w.tensors)
        full = sum(p.numel() * p.element_size() for p in trainer_model.parameters())
        assert w.nbytes < 0.1 * full
        gen.load_weights(w)
        mine = get_peft_model_state_dict(gen.model)
        theirs = get_peft_model_state_dict(trainer_model)
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
        after = {k: v for k, v in gen.model.state_dict().items() if "lora_" not in k}
        assert all(torch.equal(base_before[k], after[k]) for k in base_before)
        assert gen.version == 1

    def test_full_sync_makes_rollout_logprobs_equal_the_trainers(self):
        spec, sync, gen, shared = nodes_for(["nodes.update.mini_batch_size=32"])   # old_logprob not fused
        with torch.no_grad():
            for p in sync.policy.model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        gen.load_weights(export(spec, sync, 1))
        batch = gen.generate(0, prompts(spec, 0), Weights(version=1))
        olp = trainer_node(spec, "old_logprob", shared)
        old = olp.logprobs(0, batch).fields["old_logprob"]
        assert torch.allclose(old, batch.fields["logprob"], atol=1e-4)

    def test_bf16_on_the_cpu_is_mixed_precision_and_syncs_bf16(self):
        from omnigraph.transports.pack import TensorPack
        spec, sync, gen, shared = nodes_for(["model.dtype=bfloat16", "nodes.update.mini_batch_size=32"])
        pol = sync.policy
        assert pol.autocast and {p.dtype for p in pol.model.parameters()} == {torch.float32}   # fp32 masters
        assert {p.dtype for p in gen.model.parameters()} == {torch.bfloat16}                # bf16 rollout
        with pol.amp():
            layer = pol.model.model.layers[0].mlp.up_proj
            assert layer(torch.zeros(1, layer.in_features)).dtype == torch.bfloat16
        batch = gen.generate(0, prompts(spec, 0), Weights(0))
        batch = trainer_node(spec, "old_logprob", shared).logprobs(0, batch)
        gap = (batch.fields["old_logprob"] - batch.fields["logprob"]).abs()[batch.fields["response_mask"].bool()]
        assert gap.mean() < 0.02 and gap.max() < 0.5, (gap.mean(), gap.max())   # pure bf16 vs bf16 autocast
        upd = trainer_node(spec, "update", shared)
        before = {k: v.clone() for k, v in pol.model.state_dict().items()}
        upd.train(1, batch.with_fields(advantage=torch.randn(len(batch)).tolist()))
        state = pol.opt.state[next(iter(pol.model.parameters()))]
        assert state["exp_avg"].dtype == torch.float32
        assert any(not torch.equal(before[k], v) for k, v in pol.model.state_dict().items())
        w = export(spec, sync, 1)
        assert isinstance(w.tensors, TensorPack) and w.tensors.path == "shm" == w.path
        assert {b.dtype for b in w.tensors.buffers.values()} == {torch.bfloat16}
        gen.load_weights(w)
        for name, p in gen.model.state_dict().items():
            assert torch.equal(p, pol.model.state_dict()[name].to(torch.bfloat16)), name


def test_an_update_without_signal_leaves_the_weights_where_they_are():
    """Every advantage zero (each group's samples scored alike): no gradient, so no optimizer step. Adam's
    momentum from the step before must not move the weights on its own (a policy that drifted this way once
    turned a solved task into one of endless tool calls)."""
    spec, sync, gen, shared = nodes_for(["nodes.update.mini_batch_size=32"])
    pol = sync.policy
    batch = trainer_node(spec, "old_logprob", shared).logprobs(0, gen.generate(0, prompts(spec, 0), Weights(0)))
    upd = trainer_node(spec, "update", shared)
    upd.train(1, batch.with_fields(advantage=torch.randn(len(batch)).tolist()))      # momentum from here on
    before = {k: v.clone() for k, v in pol.model.state_dict().items()}
    upd.train(2, batch.with_fields(advantage=[0.0] * len(batch)))
    assert all(torch.equal(before[k], v) for k, v in pol.model.state_dict().items())
    upd.train(3, batch.with_fields(advantage=torch.randn(len(batch)).tolist()))      # and a signal moves them
    assert any(not torch.equal(before[k], v) for k, v in pol.model.state_dict().items())


@pytest.mark.slow
def test_one_step_off_training_through_ray_raises_the_reward(tmp_path):
    plan = og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["schedule.iterations=30"])
    result = run(plan, run_dir=tmp_path, executor="ray", progress=False)
    rewards = [r["reward_mean"] for r in result.metrics if "reward_mean" in r]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert initial_reward(result.metrics) <= 0.3 and last >= first + 0.3, rewards
    stale = [r["staleness_max"] for r in result.metrics if "staleness_max" in r]
    assert max(stale) <= plan.bound == 1
    assert result.summary["groups_lost"] == 0 and result.summary["groups_trained_twice"] == 0
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(result.run_dir / "final")
