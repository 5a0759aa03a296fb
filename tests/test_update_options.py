"""The torch update's options (``nodes.<update>.options``): activation checkpointing and token-budget
micro-batches change what the update keeps in memory and how it splits a batch, never what it learns; and the
update reports its tokens per second (and, on a GPU, its MFU)."""

from __future__ import annotations

import json

import pytest
import torch

import omnigraph as og
from omnigraph.errors import GraphError
from omnigraph.sdk import Weights
from omnigraph.testing import build_node, prompts

from conftest import GRAPHS

GRAPH = GRAPHS / "grpo_one_step_off.yaml"
BASE = ["nodes.update.mini_batch_size=64", "nodes.update.micro_batch_size=8"]


@pytest.fixture(scope="module")
def scored():
    spec = og.load(GRAPH, BASE)
    batch = build_node(spec, "generate")[0].generate(0, prompts(spec, 0), Weights(0))
    batch = build_node(spec, "reward")[0].score(0, batch)
    return build_node(spec, "old_logprob", shared={})[0].logprobs(0, batch)


def trained(batch, *options):
    spec = og.load(GRAPH, [*BASE, *options])
    shared = {}
    upd, ctx = build_node(spec, "update", shared=shared)
    calls = []
    score = upd.policy.logprobs
    upd.policy.logprobs = lambda *a, **k: calls.append(a[2]) or score(*a, **k)
    before = {k: v.detach().clone() for k, v in upd.policy.model.named_parameters()}
    upd.train(1, batch)
    after = {k: v.detach().clone() for k, v in upd.policy.model.named_parameters()}
    assert close(before, after) > 1e-4                  # the update moved the weights: there is something to compare
    ctx.metrics["checkpointing"] = upd.policy.model.is_gradient_checkpointing
    return after, ctx.metrics, calls


def close(a, b) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_activation_checkpointing_and_the_chunked_head_train_the_same_weights(scored):
    plain, m, _ = trained(scored)
    ckpt, m2, _ = trained(scored, "nodes.update.options={activation_checkpointing: true}")
    chunked, m3, _ = trained(scored, "nodes.update.options={logprob_chunk: 7, activation_checkpointing: true}")
    assert close(plain, ckpt) < 1e-5 and close(plain, chunked) < 1e-5
    assert m["loss"] == pytest.approx(m3["loss"], abs=1e-6)
    assert m["loss"] == pytest.approx(m2["loss"], abs=1e-6) and m["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert m2["checkpointing"] and not m["checkpointing"] and m2["update_tokens_per_s"] > 0


def test_a_token_budget_sizes_the_micro_batches_by_their_lengths(scored):
    rows, _, by_rows = trained(scored)
    P = scored.meta["prompt_len"]
    lengths = scored.fields["attention_mask"][:, P:].sum(1)
    budget = int(4 * (P + int(lengths.max())))          # about four of the longest rows a micro-batch
    tokens, m, by_tokens = trained(scored, f"nodes.update.options={{micro_batch_tokens: {budget}}}")
    assert len(by_rows) == len(scored) // 8
    sizes = [s.stop - s.start for s in by_tokens]
    assert sum(sizes) == len(scored) and max(sizes) <= 8 and len(by_tokens) != len(by_rows)
    for s in by_tokens:
        assert (s.stop - s.start) * (P + int(lengths[s].max())) <= budget or s.stop - s.start == 1
    assert close(rows, tokens) < 1e-5                  # only the order of the sums differs


def test_update_options_are_checked_before_anything_runs():
    with pytest.raises(GraphError, match="activation_checkpointing"):
        og.compile(GRAPH, overrides=["nodes.update.options={activation_checkpoint: true}"])
    with pytest.raises(GraphError, match="micro_batch_tokens"):
        og.compile(GRAPH, overrides=["nodes.update.options={micro_batch_tokens: 0}"])


def scores(spec, batch, chunk, temperature=0.8, **kw):
    """The trainer's log-probs and entropies of ``batch`` and the gradient of their sum, chunked or not."""
    pol = build_node(spec, "update", shared={})[0].policy
    pol.chunk = chunk
    model = pol.model
    model.zero_grad(set_to_none=True)
    P = batch.meta["prompt_len"]
    lp, ent = pol.logprobs(model, pol.on_device(batch), slice(0, len(batch)), temperature, with_entropy=True,
                           **kw)
    mask = batch.fields["response_mask"]
    (lp * mask).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads, P


def grad_gap(g, g2) -> float:
    """The largest difference of two sets of gradients over the largest gradient (a gradient that is zero in
    exact arithmetic, a key bias's under the softmax, is float noise on both sides)."""
    scale = max(float(v.abs().max()) for v in g.values())
    return max(float((g[k] - g2[k]).abs().max()) for k in g) / scale


@pytest.mark.parametrize("case", ["shared", "unshared", "lora"])
def test_the_chunked_head_gives_the_plain_log_probs_entropies_and_gradients(scored, case):
    over = ["nodes.update.lora={r: 4, alpha: 8}", "nodes.sync.payload=lora"] if case == "lora" else []
    spec = og.load(GRAPH, [*BASE, *over])
    kw = {"share": case != "unshared"}
    lp, ent, g, _ = scores(spec, scored, None, **kw)
    lp2, ent2, g2, _ = scores(spec, scored, 7, **kw)          # 7 positions a chunk: many chunks, a ragged last
    mask = scored.fields["response_mask"] > 0
    assert float((lp - lp2)[mask].abs().max()) < 1e-5 and float((ent - ent2)[mask].abs().max()) < 1e-4
    assert g.keys() == g2.keys() and len(g) > 0
    assert grad_gap(g, g2) < 1e-4


def test_the_chunked_head_leaves_the_pictures_placeholders_out_as_the_sampler_does():
    spec = og.load(GRAPHS / "vlm_one_step_off.yaml", ["nodes.update.mini_batch_size=64"])
    batch = build_node(spec, "generate")[0].generate(0, prompts(spec, 0), Weights(0))
    T = batch.meta["temperature"]
    lp, ent, g, _ = scores(spec, batch, None, T)
    lp2, ent2, g2, _ = scores(spec, batch, 16, T)
    mask = batch.fields["response_mask"] > 0
    assert float((lp2 - batch.fields["logprob"])[mask].abs().max()) < 1e-4      # the sampler's, suppress and all
    assert float((lp - lp2)[mask].abs().max()) < 1e-5
    assert grad_gap(g, g2) < 1e-4


def test_a_head_that_is_not_a_plain_product_is_refused_by_name():
    from nodes.models.chunked import hidden_states_out

    spec = og.load(GRAPH)
    model = build_node(spec, "update", shared={})[0].policy.model
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="logprob_chunk"):
        with hidden_states_out(model):
            pass


def test_a_full_update_that_cannot_fit_its_card_is_refused_before_anything_starts(tmp_path, monkeypatch):
    from nodes.trainer import memory

    # Qwen2.5-7B's shape: 7.6e9 parameters, 16 bytes each in the update's state, against an 80 GiB card
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}))
    assert memory.parameters(json.loads((tmp_path / "config.json").read_text())) == 7_615_616_512
    monkeypatch.setattr(memory, "card_gib", lambda: 80.0)
    gpu = GRAPHS / "gpu" / "grpo_one_step_off.yaml"
    with pytest.raises(GraphError, match=r"113 GiB per card.*cards of 80 GiB.*nodes.update.lora: {r: 16}") as e:
        og.compile(gpu, overrides=[f"model.path={tmp_path}"])
    assert "sharding: fsdp" in str(e.value)
    og.compile(gpu, overrides=[f"model.path={tmp_path}", "nodes.update.lora={r: 16}", "nodes.sync.payload=lora"])
    monkeypatch.setattr(memory, "card_gib", lambda: 141.0)             # an H200: the state fits (a lower bound)
    og.compile(gpu, overrides=[f"model.path={tmp_path}"])
    monkeypatch.setattr(memory, "card_gib", lambda: None)              # no GPU where the graph is checked
    og.compile(gpu, overrides=[f"model.path={tmp_path}"])


def test_a_rollout_sharing_the_trainers_card_is_counted_with_its_kv_cache(tmp_path, monkeypatch):
    from nodes.trainer import memory

    config = {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
              "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))          # Qwen2.5-7B's shape
    assert memory.kv_bytes_per_token(config, "bfloat16") == 2 * 28 * 4 * 128 * 2
    gpu = GRAPHS / "gpu" / "grpo_one_step_off.yaml"              # rollout and trainer half a card each
    lora = [f"model.path={tmp_path}", "nodes.update.lora={r: 16}", "nodes.sync.payload=lora"]
    # LoRA's float32 base (28 GiB) and the rollout's bf16 weights (14 GiB) do not share a 40 GiB card
    monkeypatch.setattr(memory, "card_gib", lambda: 40.0)
    with pytest.raises(GraphError, match=r"one card holds 28 GiB of LoRA's frozen base weights and 14 GiB of "
                                         r"'generate''s weights and KV cache.*card of 40 GiB") as e:
        og.compile(gpu, overrides=lora)
    assert e.value.where == "pools.trainer.gpus" and "a card of its own" in str(e.value)
    og.compile(gpu, overrides=[*lora, "pools.rollout.gpus=1", "pools.trainer.gpus=1"])   # a card each: fits
    # on 80 GiB they fit, until a firing's KV cache is large: 512 rows of 4096 new tokens, 112 GiB
    monkeypatch.setattr(memory, "card_gib", lambda: 80.0)
    og.compile(gpu, overrides=lora)
    with pytest.raises(GraphError, match=r"and 126 GiB of 'generate''s weights and KV cache"):
        og.compile(gpu, overrides=[*lora, "task.prompts=64", "nodes.generate.max_new_tokens=4096"])


@pytest.mark.parametrize("shape", [
    dict(model_type="llama", vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
         num_key_value_heads=3, intermediate_size=1536, tie_word_embeddings=True),
    dict(model_type="qwen2", hidden_size=896, num_hidden_layers=2, num_attention_heads=14, num_key_value_heads=2,
         intermediate_size=4864, vocab_size=1000, tie_word_embeddings=True),
    dict(model_type="mistral", hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
         intermediate_size=512, vocab_size=1000, tie_word_embeddings=False, head_dim=64),
    dict(model_type="qwen3", hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
         intermediate_size=512, vocab_size=1000, tie_word_embeddings=True, head_dim=64),
    dict(model_type="olmo2", hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
         intermediate_size=512, vocab_size=1000, tie_word_embeddings=False)])
def test_the_parameter_count_from_the_config_is_the_models_own(shape):
    from transformers import AutoConfig, AutoModelForCausalLM

    from nodes.trainer.memory import parameters

    kw = {k: v for k, v in shape.items() if k != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(shape["model_type"], **kw))
    assert parameters(shape) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("shape", ["tiny", "3b"])
def test_a_qwen25_vl_count_from_its_config_is_the_models_own_nested_or_flat(shape, tmp_path):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from nodes.trainer.memory import parameters
    from nodes.zoo import grid_vl

    text, vision = {"tiny": (grid_vl.TINY_TEXT, grid_vl.TINY_VISION),
                    "3b": (grid_vl.QWEN25_VL_3B_TEXT, grid_vl.QWEN25_VL_3B_VISION)}[shape]
    text = {"vocab_size": 1000, **text}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                              tie_word_embeddings=text.get("tie_word_embeddings", True))
    with torch.device("meta"):
        own = sum(p.numel() for p in Qwen2_5_VLForConditionalGeneration(config).parameters())
    nested = json.loads(config.to_json_string())
    flat = {**{k: v for k, v in nested.items() if k != "text_config"}, **text}      # as Qwen's own files have it
    assert parameters(nested) == parameters(flat) == own
    if shape == "3b":
        assert round(own / 1e9, 2) == 3.75          # Qwen2.5-VL-3B-Instruct, as published
    # a frozen tower keeps its float32 weights only: 4 bytes a parameter, not 16
    from nodes.trainer.memory import qwen25_vision, update_state_gib
    (tmp_path / "config.json").write_text(json.dumps(flat))
    tower = qwen25_vision(vision)
    assert update_state_gib(str(tmp_path)) * 2**30 == own * 16
    assert update_state_gib(str(tmp_path), ["vision"]) * 2**30 == (own - tower) * 16 + tower * 4
