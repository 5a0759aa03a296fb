"""Weights in one copy: coalesced copies between adjacent spans (``omnigraph.sdk.tensors.coalesce``), a trainer
whose parameters live in one flat buffer (``nodes.models.contiguous``), and the pack plans a transport keeps."""

import random

import torch

import omnigraph as og

from conftest import GRAPHS


def test_coalesced_copies_equal_the_copies_one_by_one():
    """Law: for any mix of adjacent views of one buffer, gaps and tensors of their own, the coalesced copies
    write exactly what the pairwise copies write (casting fp32 to bf16 on the way)."""
    from omnigraph.sdk.tensors import coalesce
    rng = random.Random(0)
    for _ in range(200):
        sizes = [rng.randint(1, 7) for _ in range(rng.randint(1, 12))]
        src_buf = torch.randn(sum(sizes) + 8)
        dst_a, dst_b = torch.zeros(sum(sizes) + 8, dtype=torch.bfloat16), torch.zeros(sum(sizes) + 8, dtype=torch.bfloat16)
        pairs, at = [], 0
        for n in sizes:
            at += rng.choice([0, 0, 0, 1])                   # now and then a gap
            src = src_buf[at:at + n] if rng.random() < 0.8 else torch.randn(n)
            pairs.append((at, n, src))
            at += n
            if at > len(src_buf) - 8:
                break
        for at, n, src in pairs:
            dst_a[at:at + n].copy_(src)
        d, s = coalesce([dst_b[at:at + n] for at, n, _ in pairs], [src for _, _, src in pairs])
        assert len(d) <= len(pairs)
        torch._foreach_copy_(d, s)
        assert torch.equal(dst_a, dst_b)


def test_a_trainer_with_contiguous_parameters_exports_in_one_cast():
    """The trainer's parameters live in one flat buffer in its state dict's order (nodes.models.contiguous), so
    the bf16 export of its fp32 weights is one copy, and a later in-place update is what the next export holds."""
    from omnigraph.testing import build_node
    from omnigraph.transports.pack import TensorPack
    sync, _ = build_node(og.load(GRAPHS / "grpo_sync.yaml", ["model.dtype=bfloat16"]), "sync")
    model = sync.policy.model
    params = list(model.parameters())
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1
    state, plans = sync.state(), {}
    pack = TensorPack.pack(state.tensors, dtype=state.dtype, plans=plans)
    assert pack.refill(state.tensors, dtype=state.dtype, plans=plans)
    src = plans["last"].src
    assert len(src) == 1 and src[0].numel() == sum(p.numel() for p in params)
    with torch.no_grad():
        params[3].add_(1.0)                               # what an optimizer step does: in place
    assert pack.refill(sync.state().tensors, dtype=state.dtype, plans=plans) and plans["last"].src is src
    for name, t in model.state_dict().items():
        assert torch.equal(pack[name], t.to(torch.bfloat16)), name


def test_a_cached_pack_plan_follows_a_parameter_whose_memory_was_replaced():
    """Packs of the same mapping reuse one plan (layout and coalesced copies), but a tensor whose ``.data`` was
    replaced (same object, new memory) is packed from its new memory, not from the plan's view of the old."""
    from omnigraph.transports.pack import TensorPack
    flat = torch.zeros(10)
    a, b = torch.nn.Parameter(flat[:4].view(2, 2)), torch.nn.Parameter(flat[4:].view(6))
    tensors, plans = {"a": a, "b": b}, {}
    first = TensorPack.pack(tensors, dtype=torch.bfloat16, plans=plans)
    plan = plans["last"]
    assert len(plan.src) == 1 and torch.equal(first["a"], torch.zeros(2, 2, dtype=torch.bfloat16))
    with torch.no_grad():
        flat.add_(1.0)                                   # in place: the same plan
    assert torch.equal(TensorPack.pack(tensors, dtype=torch.bfloat16, plans=plans)["b"],
                       torch.ones(6, dtype=torch.bfloat16)) and plans["last"] is plan
    a.data = torch.full((2, 2), 7.0)                     # new memory under the same parameter
    again = TensorPack.pack(tensors, dtype=torch.bfloat16, plans=plans)
    assert plans["last"] is not plan and torch.equal(again["a"], torch.full((2, 2), 7.0, dtype=torch.bfloat16))
