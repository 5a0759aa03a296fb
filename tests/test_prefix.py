"""One forward per distinct prompt (nodes.models.prefix): the same logprobs and gradients as the plain forward."""

import pytest
import torch

import omnigraph as og
from omnigraph.sdk import Weights
from omnigraph.graph.spec import LoraSpec
from omnigraph.testing import build_node, prompts

from conftest import GRAPHS
from nodes import models, zoo
from nodes.models.prefix import position_ids
from nodes.models.prefix import completion_logits, groups


def test_groups_find_each_rows_prompt_in_first_seen_order():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        k, n = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(2, 6, (1,), generator=g))
        base = torch.randint(0, 3, (k, 4), generator=g)
        order = torch.randperm(k * n, generator=g)
        ids = base.repeat_interleave(n, 0)[order]
        mask = torch.ones_like(ids)
        found = groups(ids, mask)
        if found is None:                       # randint made equal prompts... only when k distinct rows > half
            assert 2 * len(torch.unique(ids, dim=0)) > len(ids)
            continue
        first, inverse = found
        assert torch.equal(ids[first][inverse], ids)                     # each row's prompt
        assert first.tolist() == sorted(first.tolist())                  # in the order they first appear
        assert all(int(first[inverse[i]]) <= i for i in range(len(ids)))


def test_groups_tell_padding_apart_and_decline_distinct_prompts():
    ids = torch.tensor([[0, 5], [0, 5], [0, 5], [0, 5]])
    mask = torch.tensor([[0, 1], [0, 1], [1, 1], [1, 1]])   # the same tokens, padded differently
    first, inverse = groups(ids, mask)
    assert first.tolist() == [0, 2] and inverse.tolist() == [0, 0, 1, 1]
    assert groups(torch.arange(8).view(4, 2), torch.ones(4, 2)) is None


def _batch(tok, samples: int, seed: int = 0):
    """Prompts of several lengths (left padded), ``samples`` completions of each of varied lengths (right
    padded), the rows shuffled: what a GRPO batch looks like, in any order."""
    g = torch.Generator().manual_seed(seed)
    texts = ["copy 4071:", "copy 12:", "copy 987654:", "add 3+4="]
    enc = [tok(tok.bos_token + t, add_special_tokens=False)["input_ids"] for t in texts]
    P, C = max(map(len, enc)), 7
    rows, masks = [], []
    for p in enc:
        for _ in range(samples):
            n = int(torch.randint(1, C + 1, (1,), generator=g))
            comp = torch.randint(4, 40, (n,), generator=g).tolist()
            rows.append([tok.pad_token_id] * (P - len(p)) + p + comp + [tok.pad_token_id] * (C - n))
            masks.append([0] * (P - len(p)) + [1] * (len(p) + n) + [0] * (C - n))
    order = torch.randperm(len(rows), generator=g)
    return torch.tensor(rows)[order], torch.tensor(masks)[order], P


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_forward_gives_the_plain_logits_and_gradients(lora):
    model, tok = models.load(zoo.tiny(0), "float32", "cpu")
    if lora:
        model = models.with_lora(model, LoraSpec(r=4, alpha=8))
    model.train()
    ids, mask, P = _batch(tok, samples=4)
    pos = position_ids(mask)
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    params = [p for p in model.parameters() if p.requires_grad]

    def run(share):
        seen.clear()
        logits = completion_logits(model, ids, mask, pos, P, share=share)
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
        loss = (lp * mask[:, P:]).sum() / mask[:, P:].sum()
        grads = torch.autograd.grad(loss, params)
        return logits.detach(), grads, list(seen)

    plain, g_plain, calls_plain = run(False)
    shared, g_shared, calls_shared = run(True)
    hook.remove()
    C = ids.shape[1] - P
    assert calls_plain == [(16, P + C - 1)]                       # every row, whole
    assert calls_shared == [(4, P), (16, C - 1)]                  # each prompt once, then the completions
    assert torch.allclose(plain, shared, atol=1e-4), (plain - shared).abs().max()
    for a, b in zip(g_plain, g_shared):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()


def test_shared_prompt_gradients_are_the_same_on_every_run():
    """The prompts' keys and values are copied to their rows in shuffled order; the backward sums each
    prompt's copies in a fixed order, so one batch gives bit-identical gradients however the CPU's threads run
    (an indexing copy's backward adds them as the threads reach them: reruns of a run drifted apart)."""
    model, tok = models.load(zoo.tiny(0), "float32", "cpu")
    model.train()
    ids, mask, P = _batch(tok, samples=32, seed=5)          # 128 rows, 4 prompts, shuffled
    params = list(model.parameters())
    digests = set()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))                  # one thread adds in one order: nothing to check
    try:
        for _ in range(6):
            logits = completion_logits(model, ids, mask, position_ids(mask), P, share=True)
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
            grads = torch.autograd.grad((lp * mask[:, P:]).sum(), params)
            digests.add(b"".join(g.numpy().tobytes() for g in grads))
    finally:
        torch.set_num_threads(threads)
    assert len(digests) == 1, f"{len(digests)} different gradients from 6 runs of one batch"


def test_update_trains_the_same_weights_with_and_without_sharing():
    """The same AdamW step either way, up to the order of float additions. AdamW's first step moves a weight
    by about lr * sign(gradient) whatever the gradient's size, so where a gradient is within float noise of 0
    (|g| <= 1e-7 here: terms that cancel) the two orders may step it differently, by at most 2 lr; everywhere
    else the weights agree within 1e-5."""
    finals, grads, lr = [], [], 3e-4
    for share in ("true", "false"):
        spec = og.load(GRAPHS / "grpo_sync.yaml", [f"nodes.update.share_prompts={share}", f"nodes.update.lr={lr}"])
        shared = {}
        upd, _ = build_node(spec, "update", shared=shared)
        gen, _ = build_node(spec, "generate")
        torch.manual_seed(0)
        batch = gen.generate(0, prompts(spec, 0), Weights(version=0))
        batch = build_node(spec, "old_logprob", shared=shared)[0].logprobs(0, batch)
        adv = torch.randn(len(batch), generator=torch.Generator().manual_seed(1)).tolist()
        rows = []
        embed = upd.policy.model.get_input_embeddings()
        hook = embed.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
        upd.train(0, batch.with_fields(advantage=adv))
        hook.remove()
        per_prompt = spec.task.samples_per_prompt
        micro = spec.nodes["update"].micro_batch_size
        assert (micro // per_prompt in rows) == (share == "true"), rows     # each prompt once: sharing ran
        model = upd.policy.model
        finals.append({k: v.clone() for k, v in model.state_dict().items()})
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() and grads[0].keys() == grads[1].keys()
    for k in finals[0]:
        diff = (finals[0][k] - finals[1][k]).abs()
        if k in grads[0]:
            clear = grads[0][k].abs() > 1e-7
            assert clear.float().mean() > 0.9, k          # the exemption is for the few cancelling terms
            assert float(diff[clear].max()) < 1e-5, (k, float(diff[clear].max()))
        assert float(diff.max()) <= 2 * lr + 1e-7, (k, float(diff.max()))


def test_rollout_prefills_each_prompt_once_and_samples_the_same_tokens(monkeypatch):
    import nodes.rollout.hf
    spec = og.load(GRAPHS / "grpo_sync.yaml")
    gen, _ = build_node(spec, "generate")
    embed = gen.model.get_input_embeddings()
    outs, rows = [], []
    hook = embed.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    for share in (True, False):
        if not share:
            monkeypatch.setattr(nodes.rollout.hf, "prefill", lambda *a, **k: None)
        rows.clear()
        outs.append(gen.generate(0, prompts(spec, 0), Weights(version=0)))
        first = rows[0]
        assert first == (spec.task.prompts if share else spec.task.prompts * spec.task.samples_per_prompt)
    hook.remove()
    a, b = outs
    assert torch.equal(a.fields["input_ids"], b.fields["input_ids"])
    assert torch.allclose(a.fields["logprob"], b.fields["logprob"], atol=1e-4)


@pytest.mark.parametrize("share", [True, False])
def test_short_and_long_completions_split_into_two_forwards_with_the_same_gradients(share):
    from omnigraph.sdk import SampleBatch
    spec = og.load(GRAPHS / "grpo_sync.yaml")
    pol = build_node(spec, "update", shared={})[0].policy
    _, tok = models.load(zoo.tiny(0), "float32", "cpu")
    ids, mask, P = _batch(tok, samples=16, seed=3)
    C = ids.shape[1] - P
    mask[:, P + 2:] = 0                              # every completion 2 tokens or fewer...
    mask[5, P:] = 1                                  # ...but one, of all C: the padding to split off
    n = len(ids)
    batch = SampleBatch(0, list(range(n)), [0] * n, [0] * n, fields={"input_ids": ids, "attention_mask": mask},
                        meta={"prompt_len": P})
    params = [p for p in pol.model.parameters()]
    calls = []
    hook = pol.model.get_input_embeddings().register_forward_hook(lambda m, i, o: calls.append(tuple(i[0].shape)))

    def run(split):
        calls.clear()
        lp, ent = pol.logprobs(pol.model, batch, slice(0, n), 1.0, with_entropy=True, share=share, split=split)
        loss = (lp * mask[:, P:]).sum() / mask[:, P:].sum()
        return lp.detach(), ent, torch.autograd.grad(loss, params), list(calls)

    lp1, ent1, g1, calls1 = run(False)
    lp2, ent2, g2, calls2 = run(True)
    hook.remove()
    assert lp1.shape == lp2.shape == (n, C)
    # the 63 short rows without padding (their prompts once each, when shared), the long one on its own
    short = [(4, P), (n - 1, 1)] if share else [(n - 1, P + 1)]
    assert sorted(calls2) == sorted(short + [(1, P + C - 1)]), calls2
    assert len(calls1) == (2 if share else 1)
    m = mask[:, P:]                                  # beyond a completion's end: padding, never read
    assert torch.allclose(lp1 * m, lp2 * m, atol=1e-4) and torch.allclose(ent1 * m, ent2 * m, atol=1e-4)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()
