"""The GPU path: nodes on CUDA in bf16, weights by CUDA IPC, Ray placing both pools on one card.

Skipped without CUDA (CI has none). On the GPU machine, ``scripts/gpu_tests.sh``
runs them (with the carried Ray bundle: ``scripts/gpu_setup.sh``).
"""

import os
import pickle
import subprocess
import sys

import pytest
import torch

import omnigraph as og
from omnigraph.sdk import Weights
from omnigraph.testing import build_node, export, initial_reward, prompts

from conftest import GRAPHS, ROOT

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: run scripts/gpu_tests.sh on the GPU machine")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
GPU_GRAPH = GRAPHS / "gpu" / "grpo_one_step_off.yaml"


def nodes(overrides=()):
    spec = og.load(GPU_GRAPH, list(overrides))
    trainer = {}
    return spec, tuple(build_node(spec, n, shared=trainer)[0] if n in ("old_logprob", "update", "sync")
                       else build_node(spec, n)[0] for n in ("generate", "reward", "old_logprob", "update", "sync"))


def test_nodes_compute_on_cuda_in_bf16_and_hand_back_host_tensors():
    spec, (gen, rew, olp, upd, sync) = nodes(["nodes.update.mini_batch_size=128"])   # two optimizer steps: no fusion
    assert {p.device.type for p in gen.model.parameters()} == {"cuda"}
    assert {p.dtype for p in gen.model.parameters()} == {torch.bfloat16}
    pol = upd.policy
    assert pol.autocast and {(p.device.type, p.dtype) for p in pol.model.parameters()} == {("cuda", torch.float32)}
    batch = gen.generate(0, prompts(spec, 0), Weights(0))
    tensors = {k: v for k, v in batch.fields.items() if isinstance(v, torch.Tensor)}
    assert tensors and all(v.device.type == "cpu" for v in tensors.values())
    batch = rew.score(0, batch)
    batch = olp.logprobs(0, batch)
    assert batch.fields["old_logprob"].device.type == "cpu"
    with pol.amp():
        assert pol.model.model.layers[0].mlp.up_proj(torch.zeros(1, 128, device="cuda")).dtype == torch.bfloat16
    upd.train(1, batch)
    assert torch.isfinite(torch.tensor(upd.ctx.metrics["loss"])) and upd.ctx.metrics["gpu_mem_gb"] > 0
    state = pol.opt.state[next(iter(pol.model.parameters()))]
    assert state["exp_avg"].device.type == "cuda" and state["exp_avg"].dtype == torch.float32
    w = export(spec, sync, 1)
    from omnigraph.transports.pack import TensorPack
    assert isinstance(w.tensors, TensorPack) and w.tensors.path == "cuda-ipc"
    assert {b.dtype for b in w.tensors.buffers.values()} == {torch.bfloat16}
    assert w.nbytes < sum(p.numel() * 4 for p in pol.model.parameters())      # bf16 and tied weights once
    gen.load_weights(w)
    for name, p in gen.model.state_dict().items():
        assert torch.equal(p, pol.model.state_dict()[name].to(torch.bfloat16)), name


def test_cuda_ipc_pack_crosses_processes_without_the_host():
    from omnigraph.transports.pack import TensorPack
    src = {"a": torch.randn(1000, 1000, device="cuda"), "b": torch.arange(10, device="cuda")}
    pack = TensorPack.pack(src, dtype=torch.bfloat16, path="cuda-ipc")
    blob = pickle.dumps(pack)
    assert len(blob) < 4096                       # a handle, not 2 MB of weights
    code = ("import pickle, sys, torch; p = pickle.loads(sys.stdin.buffer.read()); "
            "print(p.path, p['a'].device.type, p['a'].dtype, float(p['a'].float().sum()), int(p['b'].sum()))")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    path, dev, dtype, total, ints = out.stdout.decode().split()
    assert (path, dev, dtype, int(ints)) == ("cuda-ipc", "cuda", "torch.bfloat16", 45)
    assert abs(float(total) - float(src["a"].to(torch.bfloat16).float().sum())) < 1e-2
    from omnigraph.transports.base import portable
    with portable():                              # checkpoints: host tensors, never handles
        again = pickle.loads(pickle.dumps(pack))
    assert again.path == "host" and again["a"].device.type == "cpu"


def test_ray_places_both_pools_on_one_gpu_and_the_reward_rises(tmp_path):
    from omnigraph.executors import make_executor
    plan = og.compile(GPU_GRAPH, overrides=["schedule.iterations=30", "checkpoint.every=null"])
    ex = make_executor(plan, "ray")
    ex.start()
    try:
        info = ex.info
        roll, train = info["rollout.0"], info["trainer.0"]
        assert roll["gpu_ids"] and roll["gpu_ids"] == train["gpu_ids"], info       # 0.5 + 0.5: one card
        assert roll["cuda"]["uuid"] == train["cuda"]["uuid"] and roll["cuda"]["allocated_gb"] > 0, info
        rewards, loads, records = [], [], []
        for step in ex.steps():
            records += step.records
            for r in step.records:
                if "reward_mean" in r:
                    rewards.append(r["reward_mean"])
                if "load_weights_s" in r:
                    loads.append(r["load_weights_s"])
        ex.finish(str(tmp_path))
    finally:
        ex.stop()
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert initial_reward(records) <= 0.3 and last >= first + 0.3, rewards
    assert loads and max(loads) < 1.0, loads
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(tmp_path / "final")


def test_static_decoding_compiles_once_at_start_and_samples_with_the_models_logprobs():
    """The compiled step sees weights loaded in place, its logprobs are the model's (a teacher-forced forward of
    the same tokens), and neither shorter prompts nor a greedy evaluation compile again."""
    from nodes.models.tokens import token_logprobs
    spec = og.load(GPU_GRAPH, ["nodes.generate.max_new_tokens=24"])
    gen, ctx = build_node(spec, "generate")
    assert gen.decoder is not None and ctx.metrics["decode_compile_s"] > 0 and len(gen.decoder.compiles) == 1
    halved = {k: v * 0.5 for k, v in gen.model.state_dict().items()}        # weights that change every answer
    gen.load_weights(Weights(1, tensors=halved))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    batch = gen.generate(1, prompts(spec, 1), Weights(1))
    gen.evaluate(prompts(spec, 2)[:5])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs and len(gen.decoder.compiles) == 1
    ids, mask = batch.fields["input_ids"].cuda(), batch.fields["attention_mask"].cuda()
    P = batch.meta["prompt_len"]
    with torch.no_grad():
        logits = gen.model(input_ids=ids, attention_mask=mask,
                           position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits[:, P - 1:-1]
    lp = token_logprobs(logits, ids[:, P:], spec.nodes["generate"].temperature).cpu()
    m = batch.fields["response_mask"].bool()
    gap = (lp[m] - batch.fields["logprob"][m]).abs()
    assert m.sum() > 0 and gap.mean() < 0.02 and gap.max() < 0.25, (gap.mean(), gap.max())


def test_cuda_ipc_receiver_keeps_each_buffer_open_and_copies_every_version_into_its_tensors():
    import struct
    from omnigraph.sdk import WeightsState
    from omnigraph.transports.packed import KEEP, CudaIpc
    code = r"""
import pickle, struct, sys, torch
from omnigraph.transports import pack
from omnigraph.transports.packed import CudaIpc
rx = CudaIpc("sync")
dst = {"a": torch.zeros(1000, 1000, dtype=torch.bfloat16, device="cuda"), "b": torch.zeros(10, dtype=torch.long, device="cuda")}
while len(head := sys.stdin.buffer.read(8)) == 8:
    w = rx.arrive(pickle.loads(sys.stdin.buffer.read(struct.unpack("<Q", head)[0])), dst)
    print(w.version, w.loaded, repr(float(dst["a"].float().sum())), int(dst["b"].sum()), len(pack._OPENED), flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    tx = CudaIpc("sync")
    src = {"a": torch.randn(1000, 1000, device="cuda"), "b": torch.arange(10, device="cuda")}
    try:
        for v in range(1, 2 * KEEP + 2):
            src["a"].add_(1.0)
            w = tx.export(WeightsState(src, "full", torch.bfloat16), v)
            blob = pickle.dumps(w)
            assert len(blob) < 8192                   # handles, not 2 MB of weights
            proc.stdin.write(struct.pack("<Q", len(blob)) + blob)
            proc.stdin.flush()
            line = proc.stdout.readline().decode().split()
            assert line[:2] == [str(v), "True"], line
            want = float(src["a"].to(torch.bfloat16).float().sum())
            assert abs(float(line[2]) - want) <= 1e-5 * abs(want) and int(line[3]) == 45, (line, want)
            assert int(line[4]) == min(v, KEEP)       # each of the sender's packs opened once, then kept
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        tx.close()


# Two GPUs (whole cards per pool, weights over NCCL): tests/test_gpu_multi.py


VLM_GPU = ["model.dtype=bfloat16", "pools.rollout.gpus=0.5", "pools.trainer.gpus=0.5"]
"""The image-text graph (tiny-vl) on one card, in bf16: the rollout and the trainer half the card each."""


@pytest.mark.parametrize("model", ["tiny-vl", "qwen2.5-vl"])
def test_an_image_text_policy_on_cuda_samples_what_the_trainer_scores_and_updates(model, tmp_path):
    from nodes.models.vision import model_inputs
    from nodes.zoo import grid_vl
    path = grid_vl.build(tmp_path / "grid-vl") if model == "qwen2.5-vl" else model     # random weights: 3-D positions
    spec = og.load(GRAPHS / "vlm_one_step_off.yaml", [*VLM_GPU, "nodes.update.mini_batch_size=64",
                                                      f"model.path={path}"])
    shared = {}
    gen = build_node(spec, "generate")[0]          # decode: auto compiles the static step; pictures decode eagerly
    assert {p.device.type for p in gen.model.parameters()} == {"cuda"}
    batch = gen.generate(0, prompts(spec, 0), Weights(0))
    assert all(t.device.type == "cpu" for p in batch.fields["pixel_values"] for t in model_inputs(p).values())
    assert gen.ctx.metrics["encoder_s"] > 0
    batch = build_node(spec, "reward")[0].score(0, batch)
    batch = build_node(spec, "old_logprob", shared=shared)[0].logprobs(0, batch)
    m = batch.fields["response_mask"]
    gap = float(((batch.fields["old_logprob"] - batch.fields["logprob"]).abs() * m).sum() / m.sum())
    assert gap < 0.05, gap                         # bf16 sampling against the trainer's bf16 autocast
    upd = build_node(spec, "update", shared=shared)[0]
    upd.train(1, batch)
    assert torch.isfinite(torch.tensor(upd.ctx.metrics["loss"])) and upd.ctx.metrics["update_encoder_s"] > 0


def test_an_image_text_policy_learns_on_one_gpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "omnigraph.cli", "run", str(GRAPHS / "vlm_one_step_off.yaml"),
                          *VLM_GPU, "schedule.iterations=20", "nodes.generate.eval_every=19", "--quiet",
                          "--run-dir", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    import json
    rows = [json.loads(line) for line in next(tmp_path.glob("*/metrics.jsonl")).read_text().splitlines()]
    evals = [r["eval_reward"] for r in rows if r.get("eval_reward") is not None]
    print("held-out reward on one GPU, bf16:", evals)
    assert evals[-1] >= evals[0] + 0.3, evals
