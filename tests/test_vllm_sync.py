"""After many syncs the rollout samples from the trainer's weights: every payload, every weights layout.

A rollout that samples from other weights than the ones the trainer scores breaks learning without an error:
the importance weights saturate and the policy drifts. Here the trainer's weights change before each of
``SYNCS`` syncs (every parameter the payload carries); after each, the rollout samples completions of fixed
prompts and its log-probs of the sampled tokens are compared with the trainer's log-probs of the same tokens:

- float32: within ``FP32_BAND`` (observed differences are ~1e-5);
- bfloat16: two kernels round bf16 differently, so the band is what the engine computes on the same weights
  loaded through vLLM's own loader (``reload_weights`` on a fresh plan): the mean gap may exceed that
  reference's by at most ``BF16_MEAN_SLACK`` and the largest by at most ``BF16_MAX_SLACK`` nats (serving other
  weights showed 3-13 nats).

Cases: the ``hf`` backend with the full and the delta payload (written into the rollout's own tensors); the
``vllm`` backend with the full payload, LoRA merged into the engine and LoRA adapters, in float32 and
bfloat16, on vLLM's own layout and, on CPUs with AMX, on sgl-kernel's refilled layout (``packed_weights``).
vLLM cases need the ``vllm`` extra; each case says why it skips.
"""

import pytest
import torch

import omnigraph as og
from omnigraph.sdk import Prompt, Weights
from omnigraph.testing import build_node, export
from omnigraph.transports.delta import Encoder, apply

from conftest import GRAPHS
from test_vllm import HAVE_VLLM, TEXTS, WHY, forget_kept_weights, shutdown, trainer_logprobs

pytestmark = pytest.mark.slow

SYNCS = 12
FP32_BAND = 1e-4
BF16_MEAN_SLACK, BF16_MAX_SLACK = 0.02, 0.5
AMX = torch.cpu._is_amx_tile_supported()
NO_AMX = "sgl-kernel's refilled layout (packed_weights) is used only on CPUs with AMX"
LORA = ["nodes.update.lora={r: 4, alpha: 8}", "nodes.sync.payload=lora"]
PAYLOADS = {"full": ["nodes.sync.payload=full"], "delta": ["nodes.sync.payload=delta"],
            "lora-merged": [*LORA, "nodes.generate.options.lora_serving=merged"], "lora": [*LORA, "nodes.generate.options.lora_serving=adapter"]}


def build(backend: str, payload: str, dtype: str):
    over = [f"nodes.generate.backend={backend.split('-')[0]}", f"model.dtype={dtype}", "nodes.generate.dtype=null",
            "nodes.generate.temperature=1.0", "nodes.generate.max_new_tokens=12", *PAYLOADS[payload]]
    if backend == "vllm-packed":
        over.append("nodes.generate.options={packed_weights: true}")
    if backend.startswith("vllm"):
        from nodes.rollout.vllm_engine import VllmGenerate
        VllmGenerate.engine_args = {"block_size": 32}     # prefix-cached prompts: a stale cache would show
    spec = og.load(GRAPHS / "grpo_sync.yaml", over)
    sync, _ = build_node(spec, "sync")
    gen, _ = build_node(spec, "generate")
    return spec, sync, gen


def step(model, version: int, lora: bool) -> None:
    """The trainer's weights move (as an update moves them): every parameter the payload carries."""
    g = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if lora == ("lora_" in name):
                p.add_((0.05 if lora else 0.01) * torch.randn(p.shape, generator=g, dtype=p.dtype))


def gaps(gen, policy, seed: int) -> torch.Tensor:
    """|the rollout's log-prob - the trainer's| of every token the rollout samples for the fixed prompts."""
    out = gen.sample([gen.encode(Prompt(t)) for t in TEXTS], 4, greedy=False, seed=seed)
    mask = out["response_mask"].bool()
    assert mask.sum() > len(out["completion"])          # completions longer than one token
    return (trainer_logprobs(policy, out, 1.0) - out["logprob"]).abs()[mask]


def received(spec, sync, version: int, encoder: Encoder | None, gen, held: int) -> Weights:
    """What the rollout takes at ``version``: the export through the plan's transport, a delta applied to the
    rollout's own tensors as the executor applies it."""
    if encoder is None:
        return export(spec, sync, version)
    state = sync.state()
    delta = encoder.encode(state.tensors, state.dtype, version)
    if delta.payload == "full":
        return Weights(version, payload="full", tensors=delta.tensors)
    apply(delta.tensors, gen.weight_targets("full"), held)
    return Weights(version, payload="full", loaded=True)


def own_loader_band(gen, spec, sync, version: int) -> tuple[float, float]:
    """The bf16 reference: the gap of the same weights loaded through vLLM's own loader (then the paths are
    learned again for the next load)."""
    forget_kept_weights(gen)
    gen.load_weights(export(spec, sync, version + 1))      # the same weights under a new version number
    g = gaps(gen, sync.policy, seed=version)
    return float(g.mean()), float(g.max())


CASES = [("hf", "full", "float32"), ("hf", "delta", "float32"),
         *[("vllm", p, d) for d in ("float32", "bfloat16") for p in ("full", "lora-merged", "lora")],
         ("vllm-packed", "full", "bfloat16"), ("vllm-packed", "lora-merged", "bfloat16")]


@pytest.mark.parametrize("backend, payload, dtype", CASES, ids=["-".join(c) for c in CASES])
def test_after_many_syncs_the_rollout_samples_what_the_trainer_scores(backend, payload, dtype):
    if backend.startswith("vllm") and not HAVE_VLLM:
        pytest.skip(WHY)
    if backend == "vllm-packed" and not AMX:
        pytest.skip(NO_AMX)
    spec, sync, gen = build(backend, payload, dtype)
    lora = payload.startswith("lora")
    encoder = Encoder() if payload == "delta" else None
    worst, stale = [], []
    try:
        for version in range(1, SYNCS + 1):
            step(sync.policy.model, version, lora)
            if version > 1:       # what serving the previous version would show: the check can fail
                stale.append(float(gaps(gen, sync.policy, seed=version).max()))
            gen.load_weights(received(spec, sync, version, encoder, gen, version - 1))
            assert gen.version == version
            g = gaps(gen, sync.policy, seed=version)
            worst.append((version, float(g.mean()), float(g.max())))
            if backend.startswith("vllm") and payload != "lora":
                # from the second load on, the engine's own weights are refilled (in place, direct, packed)
                assert version == 1 or gen.ctx.metrics["weights_in_place"] == 1.0, (version, gen.ctx.metrics)
            if backend == "vllm-packed":
                assert version == 1 or gen.ctx.metrics["weights_packed_layers"] > 0
        if dtype == "float32":
            assert max(m for _, _, m in worst) < FP32_BAND, worst
            assert min(stale) > 10 * FP32_BAND, stale
        else:
            ref_mean, ref_max = own_loader_band(gen, spec, sync, SYNCS)
            assert all(m <= ref_mean + BF16_MEAN_SLACK and x <= ref_max + BF16_MAX_SLACK for _, m, x in worst), \
                (worst, ref_mean, ref_max)
            assert min(stale) > ref_max + BF16_MAX_SLACK, (stale, ref_max)
    finally:
        if backend.startswith("vllm"):
            shutdown(gen)
