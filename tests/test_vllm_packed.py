"""The ``vllm`` backend's refilled weight layout on AMX CPUs (``nodes.rollout.vllm_weights``, ``Direct``'s packed layers):
in bfloat16 the direct load path moves the linear layers (and the tied head) onto sgl-kernel buffers it refills
in place with ``omnigraph.sdk.cpu_kernels.pack_vnni``. Checked against sgl-kernel's own packing, bit for bit,
and against what the engine computes on vLLM's own layout.

Needs the ``vllm`` extra and a CPU with AMX; skipped otherwise (saying which).
"""

import pytest
import torch

import omnigraph as og
from omnigraph.sdk import Prompt
from omnigraph.testing import build_node, export

from conftest import GRAPHS
from test_vllm import HAVE_VLLM, TEXTS, WHY, forget_kept_weights, make, perturb, shutdown, trainer_logprobs

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_VLLM, reason=WHY)]

AMX = torch.cpu._is_amx_tile_supported()
NO_AMX = "sgl-kernel's packed layout (and omnigraph's refill of it) is used only on CPUs with AMX"


def packed_buffers_match_sgl(gen, tensors) -> int:
    """Every layer the direct path packs holds sgl-kernel's own packing of the received tensors (for the
    output head: of its received rows); returns how many layers it packs."""
    def check(wrapper):
        direct = getattr(wrapper, "worker", wrapper)._omnigraph_direct
        for layer, srcs, _bias, buffer in direct.packed:
            weight = torch.cat([tensors[n] for n in srcs]).to(buffer.dtype)
            rows = weight.shape[0] * weight.shape[1]
            want = torch.ops._C.convert_weight_packed(weight).reshape(-1)
            assert torch.equal(buffer.reshape(-1)[:rows].view(torch.int16), want.view(torch.int16)), srcs
        return len(direct.packed)
    return gen.llm.collective_rpc(check)[0]


def trainer_gap(policy, out, temperature) -> float:
    """Mean absolute difference between the engine's sampled logprobs and the trainer's for the same tokens."""
    mask = out["response_mask"].bool()
    return float((trainer_logprobs(policy, out, temperature) - out["logprob"]).abs()[mask].mean())


def reload_as_vllm_alone(gen, weights, monkeypatch) -> None:
    """Load ``weights`` through vLLM's ``reload_weights`` and leave every layer on the kernel vLLM picks."""
    from nodes.rollout import vllm_weights
    forget_kept_weights(gen)
    with monkeypatch.context() as m:
        m.setattr(vllm_weights, "_to_packed", lambda model, linear, *args: (linear, [], False))
        gen.load_weights(weights)
    assert gen.ctx.metrics["weights_direct"] == 0.0


@pytest.mark.skipif(not AMX, reason=NO_AMX)
def test_bf16_layers_compute_from_buffers_refilled_in_place_as_vllm_packs_them(monkeypatch):
    """The direct path in bfloat16 on an AMX CPU: the linear layers compute from sgl-kernel buffers that each
    load refills in place (``omnigraph.sdk.cpu_kernels.pack_vnni``); the bytes equal sgl-kernel's packing of
    the received weights, and the engine samples exactly what it samples after vLLM's own reload of them
    (the tiny model's layers are small: vLLM computes them with sgl-kernel too)."""
    spec, sync, gen = make(["model.dtype=bfloat16", "nodes.generate.dtype=null", "nodes.generate.max_new_tokens=12",
                             "nodes.generate.options={packed_weights: true}"])
    try:
        pol = sync.policy
        ids = [gen.encode(Prompt(t)) for t in TEXTS]
        perturb(pol.model, 0.05)
        gen.load_weights(export(spec, sync, 1))                  # reload_weights, then the plan is learned
        assert gen.ctx.metrics["weights_direct"] == 0.0
        perturb(pol.model, 0.05)
        w = export(spec, sync, 2)
        gen.load_weights(w)
        assert gen.ctx.metrics["weights_direct"] == 1.0
        assert gen.ctx.metrics["weights_packed_layers"] == 8     # 2 layers x (qkv, o, gate_up, down); head: 51 rows
        assert packed_buffers_match_sgl(gen, w.tensors) == 8
        packed = gen.sample(ids, 4, greedy=False, seed=11)
        reload_as_vllm_alone(gen, w, monkeypatch)                # the same weights, vLLM's own packing
        reloaded = gen.sample(ids, 4, greedy=False, seed=11)
        assert torch.equal(packed["input_ids"], reloaded["input_ids"])
        assert torch.equal(packed["logprob"], reloaded["logprob"])
    finally:
        shutdown(gen)


@pytest.mark.skipif(not AMX, reason=NO_AMX)
def test_smollm2_bf16_moves_every_linear_layer_and_the_tied_head_onto_refilled_buffers(monkeypatch):
    """SmolLM2-135M in bfloat16: vLLM computes its large layers and the tied head with oneDNN; the direct path
    moves all 121 (30 x 4 and the head) onto sgl-kernel buffers and refills them in place from the received
    tensors (the head from the received embeddings). Greedy completions stay those of vLLM's own reload of
    the same weights; sampled logprobs are as close to the trainer's as vLLM's own (here 0.052 against 0.047
    on average: other kernels round bf16 differently, and at SmolLM2's logits one bf16 step is 0.1-0.2)."""
    from nodes.rollout.vllm_engine import VllmGenerate
    VllmGenerate.engine_args = {}
    spec = og.load(GRAPHS / "smollm2_vllm_one_step_off.yaml", [
        "model.dtype=bfloat16", "nodes.generate.dtype=null", "nodes.update.lora=null", "nodes.sync.payload=full",
        "nodes.generate.max_new_tokens=8", "nodes.generate.options={packed_weights: true}"])
    sync, _ = build_node(spec, "sync")
    gen, _ = build_node(spec, "generate")
    try:
        ids = [gen.encode(Prompt(f"What is {a} + {b}? Reply with just the number.")) for a, b in ((13, 14), (2, 40))]
        perturb(sync.policy.model, 1e-3)
        gen.load_weights(export(spec, sync, 1))
        perturb(sync.policy.model, 1e-3)
        w = export(spec, sync, 2)
        gen.load_weights(w)
        assert gen.ctx.metrics["weights_direct"] == 1.0 and gen.ctx.metrics["weights_packed_layers"] == 121
        assert packed_buffers_match_sgl(gen, w.tensors) == 121
        greedy, sampled = gen.sample(ids, 1, greedy=True, seed=0), gen.sample(ids, 4, greedy=False, seed=3)
        reload_as_vllm_alone(gen, w, monkeypatch)
        assert torch.equal(greedy["input_ids"], gen.sample(ids, 1, greedy=True, seed=0)["input_ids"])
        again = gen.sample(ids, 4, greedy=False, seed=3)
        # each engine's sampled logprobs against the trainer's for the same tokens
        far = [trainer_gap(sync.policy, out, 0.7) for out in (sampled, again)]
        print("mean |engine - trainer| logprob: packed %.4f, vLLM's own %.4f" % tuple(far))
        assert far[0] <= 1.25 * far[1] + 0.005, far
    finally:
        shutdown(gen)
