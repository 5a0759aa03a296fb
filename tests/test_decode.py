"""Static decoding (nodes/rollout/decode.py), the parts that need no GPU: the shape buckets, the batch padding, the
``decode`` option, and the decode loop itself run eagerly on the CPU against transformers' ``generate``.
tests/test_gpu.py runs it compiled on CUDA."""

import pytest
import torch

import omnigraph as og
from omnigraph.errors import GraphError

from nodes.rollout import decode as D
from nodes.models.tokens import token_logprobs

from conftest import GRAPHS


class TestBuckets:
    def test_a_prompt_length_rounds_up_to_a_power_of_two_of_at_least_32(self):
        assert [D.bucket(n) for n in (1, 31, 32, 33, 64, 65, 1000)] == [32, 32, 32, 64, 64, 128, 1024]

    def test_the_batch_is_padded_with_copies_of_its_first_row_and_says_how_many_are_real(self):
        rows, n = D.pad_rows([[5, 6], [7]], 4)
        assert (rows, n) == ([[5, 6], [7], [5, 6], [5, 6]], 2)
        assert D.pad_rows([[1]], 1) == ([[1]], 1)

    def test_a_batch_larger_than_the_fixed_size_is_refused_by_pad_rows_and_cut_by_chunks(self):
        with pytest.raises(ValueError, match="1 to 2 rows, got 3"):
            D.pad_rows([[1], [2], [3]], 2)
        assert D.chunks(5, 2) == [(0, 2), (2, 4), (4, 5)] and D.chunks(4, 4) == [(0, 4)]


def small_model():
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=128, vocab_size=300,
                               max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


def rows_of(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 300, (n,), generator=g).tolist() for n in lengths]


def reference(model, rows, C, **sampling):
    """transformers' ``generate`` with a dynamic cache: the new tokens and their logprobs."""
    P = max(map(len, rows))
    ids = torch.tensor([[0] * (P - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=C, eos_token_id=[1, 7], pad_token_id=0,
                         output_logits=True, return_dict_in_generate=True, **sampling)
    comp = out.sequences[:, P:]
    return comp, token_logprobs(torch.stack(out.logits, 1), comp, sampling.get("temperature") or 1.0)


class TestTheDecodeLoop:
    """The loop the compiled step runs in, uncompiled: the same tokens and logprobs as ``generate``."""

    @pytest.mark.parametrize("greedy, temperature, top_p", [(True, 1.0, 1.0), (False, 1.0, 1.0), (False, 0.7, 0.9)])
    def test_it_gives_generates_tokens_and_logprobs(self, greedy, temperature, top_p):
        model, rows = small_model(), rows_of([5, 9, 3, 17, 12])
        sampling = ({"do_sample": False} if greedy else
                    {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0})
        torch.manual_seed(5)
        comp, lp = reference(model, rows, 20, **sampling)
        dec = D.StaticDecoder(model, len(rows), 20, 0, compiled=False)
        torch.manual_seed(5)
        toks, lps = dec.decode(rows, max_new_tokens=20, greedy=greedy, temperature=temperature, top_p=top_p,
                               stops=[1, 7])
        c = comp.shape[1]
        assert torch.equal(toks[:, :c], comp) and bool((toks[:, c:] == 0).all())
        assert torch.allclose(lps[:, :c], lp, atol=1e-5)

    def test_dummy_rows_and_pieces_change_no_greedy_answer(self):
        model, rows = small_model(), rows_of([4, 11, 6, 8, 2])
        comp, _ = reference(model, rows, 12, do_sample=False)
        for batch in (8, 2):                  # padded with dummy rows; cut into pieces of two (and one)
            toks, _ = D.StaticDecoder(model, batch, 12, 0, compiled=False).decode(
                rows, max_new_tokens=12, greedy=True, temperature=1.0, top_p=1.0, stops=[1, 7])
            assert toks.shape[0] == 5 and torch.equal(toks[:, :comp.shape[1]], comp), batch

    def test_the_cache_only_grows_so_a_shorter_prompt_compiles_nothing(self):
        """Traced by dynamo (a counting backend, no inductor): one graph, again only when the cache grows."""
        model = small_model()
        torch._dynamo.reset()
        graphs = []
        dec = D.StaticDecoder(model, 4, 10, 0, compiled=False)
        dec.step = torch.compile(D._step, backend=lambda gm, _: graphs.append(gm) or gm.forward, dynamic=False)
        for lengths, L in (([20, 3], 32 + 10), ([5, 7, 2], 32 + 10), ([40], 64 + 10), ([9], 64 + 10)):
            rows = rows_of(lengths)
            comp, _ = reference(model, rows, 10, do_sample=False)
            toks, _ = dec.decode(rows, max_new_tokens=10, greedy=True, temperature=1.0, top_p=1.0, stops=[1, 7])
            assert dec.L == L and torch.equal(toks[:, :comp.shape[1]], comp)
        assert len(graphs) == 2


class TestTheOption:
    def test_auto_decodes_eagerly_on_the_cpu(self):
        from omnigraph.testing import build_node
        plan = og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["schedule.iterations=2"])
        assert plan.graph.nodes["generate"].backend_options.decode.mode == "auto"
        gen, _ = build_node(plan.graph.spec, "generate")
        assert gen.decoder is None

    def test_a_word_is_the_mode(self):
        plan = og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["nodes.generate.options.decode=eager"])
        decode = plan.graph.nodes["generate"].backend_options.decode
        assert (decode.mode, decode.prompt_len) == ("eager", 64)

    def test_static_on_a_pool_without_gpus_is_refused_with_the_fix(self):
        with pytest.raises(GraphError, match=r"nodes\.generate\.options\.decode: decode: static compiles the decode "
                                             r"step for CUDA, but pool 'rollout' has no GPU \(fix: use decode: auto"):
            og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["nodes.generate.options.decode=static"])

    def test_static_is_checked_against_the_pool_so_a_gpu_graph_passes_on_a_cpu_machine(self):
        og.compile(GRAPHS / "gpu" / "grpo_one_step_off.yaml", overrides=["nodes.generate.options.decode=static"])

    def test_decode_on_another_backend_is_an_unknown_option_of_that_backend(self):
        with pytest.raises(GraphError, match=r"nodes\.generate\.options\.decode: unknown generate backend synthetic "
                                             r"option 'decode' \(known: cost_per_token\)"):
            og.compile(GRAPHS / "grpo_one_step_off.yaml",
                       overrides=["nodes.generate.backend=synthetic", "nodes.generate.options.decode=eager"])

    def test_a_misspelt_option_gets_the_closest_known_one(self):
        with pytest.raises(GraphError, match=r"nodes\.generate\.options\.decod: unknown generate backend hf option "
                                             r"'decod' \(did you mean 'decode'\?"):
            og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["nodes.generate.options.decod=eager"])


class TestGroupedQueryAttention:
    def test_a_decode_step_gives_sdpas_logits_without_copying_the_key_value_heads(self, monkeypatch):
        """One new token per row over a left-padded cache: the same logits as sdpa's (which copies each key/value
        head for its query heads), through the folded path; a prompt of several tokens goes to sdpa unchanged."""
        from transformers import DynamicCache
        from nodes.models.prefix import position_ids
        model, rows = small_model(), rows_of([5, 9, 3])
        P = 9
        ids = torch.tensor([[0] * (P - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows])
        nxt, full = torch.tensor([[11], [12], [13]]), torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)

        def logits():
            cache = DynamicCache(config=model.config)
            first = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), past_key_values=cache)
            step = model(input_ids=nxt, attention_mask=full, position_ids=position_ids(full)[:, -1:],
                         past_key_values=first.past_key_values)
            return first.logits, step.logits

        plain = logits()
        folded = []
        real = torch.nn.functional.scaled_dot_product_attention
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            lambda q, k, v, **kw: folded.append((q.shape, k.shape)) or real(q, k, v, **kw))
        assert D.use_gqa(model) and model.config._attn_implementation == D.GQA
        gqa = logits()
        assert torch.allclose(plain[0], gqa[0], atol=1e-5) and torch.allclose(plain[1], gqa[1], atol=1e-5)
        # 2 layers: the prompt through sdpa (key/value heads copied: 4 of them), the step folded (2 heads x 2 rows)
        assert folded == [((3, 4, P, 16), (3, 4, P, 16))] * 2 + [((3, 2, 2, 16), (3, 2, P + 1, 16))] * 2
