"""Two GPUs: trainer and rollout on whole cards of their own, weights over NCCL (omnigraph.weightsync).

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
    from omnigraph.executors.base import make_executor
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
        "schedule.iterations=4", "checkpoint.every=null", "pools.trainer.gpus=1", "pools.rollout.gpus=1",
        "model.dtype=bfloat16", "nodes.update.lora={r: 4, alpha: 8}", "nodes.sync.payload=lora",
        "nodes.sync.bucket_mb=0.01"])                         # tiny buckets: many per sync
    records, states = _run(plan, "ray-tasks")
    versions = [r["weights_version"] for r in records if "weights_version" in r]
    assert versions == [0, 1, 2, 3], versions
    assert _same_weights(states, lora=True) > 4
