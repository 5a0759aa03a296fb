"""Two GPUs: trainer and rollout on whole cards of their own, weights over NCCL (omnigraph.transports.nccl).

Skipped without two CUDA devices (CI has none). On such a machine ``scripts/gpu_tests.sh multi`` runs them
(with the carried Ray bundle: ``scripts/gpu_setup.sh``).
"""

import os
import pickle

import pytest
import torch

import omnigraph as og

from conftest import GRAPHS
from test_weightsync import two_processes

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2,
                                reason=f"needs two CUDA GPUs (this machine has {torch.cuda.device_count()}): "
                                       "run scripts/gpu_tests.sh multi on a machine with two")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
TWO_GPU = GRAPHS / "gpu" / "grpo_one_step_off_2gpu.yaml"


def test_nccl_send_and_receive_between_two_gpus_in_buckets():
    sender, receiver = two_processes("nccl", 256 << 10)          # 420 kB of bf16 weights: several buckets
    assert sender["buckets"] > 1 and sender["aliases"] == {"head": "emb"}
    assert receiver == {"direct": True, "fetched": True, "tied": True}


def _states(ex) -> dict[str, dict]:
    """Each actor's node state (models) from a snapshot, on this process's GPU."""
    return {actor: pickle.loads(blob)["nodes"] for actor, blob in ex.snapshot().items()}


def _run(plan, executor: str):
    from omnigraph.executors import make_executor
    ex = make_executor(plan, executor)
    ex.start()
    try:
        info = ex.info
        assert info["rollout.0"]["cuda"]["uuid"] != info["trainer.0"]["cuda"]["uuid"], info
        records = [r for s in ex.steps() for r in s.records]
        states = _states(ex)
    finally:
        ex.stop()
    return records, states


def _same_weights(states, lora: bool) -> int:
    """The rollout's model == the trainer's weights cast to bf16 (the last sync was received); tensors compared."""
    rollout = states["rollout.0"]["generate"]["model"]
    trainer = states["trainer.0"]["update"]["model"]
    names = [k for k in trainer if "lora_" in k or not lora]
    for k in names:
        assert torch.equal(rollout[k].to("cuda:0"), trainer[k].to("cuda:0", torch.bfloat16)), k
    return len(names)


@pytest.mark.parametrize("executor", ["ray", "ray-tasks"])
def test_one_step_off_1_plus_1_over_nccl(executor):
    plan = og.compile(TWO_GPU, overrides=["schedule.iterations=5", "checkpoint.every=null"])
    assert {c.transport for c in plan.channels if c.edge.state and c.src.actor != c.dst.actor} == {"nccl"}
    records, states = _run(plan, executor)
    versions = [r["weights_version"] for r in records if "weights_version" in r]
    assert versions == [0, 0, 1, 2, 3], versions             # generate(t) uses sync(t - 1): one step off
    applies = [r for r in records if r.get("kind") == "apply"]
    assert len(applies) == 5 and all(r["apply_s"] < 5 for r in applies), applies
    assert _same_weights(states, lora=False) > 10


def test_sync_mode_with_lora_over_nccl_on_ray_tasks():
    plan = og.compile(GRAPHS / "grpo_sync.yaml", overrides=[
        "schedule.iterations=4", "checkpoint.every=null", "pools.trainer.gpus=1",
        "pools.rollout={actors: 1, cpus: 1, gpus: 1}", "nodes.generate.pool=rollout", "nodes.reward.pool=rollout",
        "model.dtype=bfloat16", "nodes.update.lora={r: 4, alpha: 8}", "nodes.sync.payload=lora",
        "nodes.sync.transport_options.bucket_mb=0.01"])                         # tiny buckets: many per sync
    records, states = _run(plan, "ray-tasks")
    versions = [r["weights_version"] for r in records if "weights_version" in r]
    assert versions == [0, 1, 2, 3], versions
    assert _same_weights(states, lora=True) > 4


def test_a_rollout_killed_mid_run_on_two_gpus_restarts_into_a_new_nccl_group(tmp_path, monkeypatch):
    """kill -9 of the rollout actor (GPU 1) at step 12: the supervisor tears both actors down, starts them again,
    they form a fresh NCCL group and the run resumes from the step-10 checkpoint; no prompt group is lost or
    trained twice and the reward still rises."""
    from omnigraph.runtime.ledger import read
    from omnigraph.runtime import run
    monkeypatch.setenv("OMNIGRAPH_INJECT", "generate@12:exit")
    plan = og.compile(TWO_GPU, overrides=["schedule.iterations=30", "checkpoint.every=10", "runtime.max_restarts=1"])
    res = run(plan, run_dir=tmp_path, progress=False)
    s = res.summary
    assert len(s["restarts"]) == 1 and "generate" in s["restarts"][0]["cause"], s["restarts"]
    ledger = read(res.run_dir)
    assert ledger.ok and ledger.trained_once == ledger.generated == 30 * plan.graph.spec.task.prompts, ledger
    assert s["observed_max_staleness"] <= 1 and s["reward_last"] > s["reward_first"] + 0.3, s


def test_two_trainer_gpus_train_as_one_over_nccl():
    """Data-parallel update over an NCCL group of two trainer actors (a GPU each; the rollout on the CPU): the
    ranks stay bit-identical and the reward rises."""
    from omnigraph.executors import make_executor
    plan = og.compile(TWO_GPU, overrides=["pools.trainer.actors=2", "pools.rollout.gpus=0", "pools.rollout.cpus=1",
                                          "schedule.iterations=30", "checkpoint.every=null"])
    assert [(g.name, g.members, g.backend) for g in plan.groups] == [("dp-trainer", ("trainer.0", "trainer.1"), "nccl")]
    ex = make_executor(plan, "ray")
    ex.start()
    try:
        info = ex.info
        assert info["trainer.0"]["cuda"]["uuid"] != info["trainer.1"]["cuda"]["uuid"], info
        rewards = [r["reward_mean"] for s in ex.steps() for r in s.records if "reward_mean" in r]
        states = _states(ex)
    finally:
        ex.stop()
    a, b = (states[f"trainer.{r}"]["update"]["model"] for r in (0, 1))
    assert all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.3, rewards
