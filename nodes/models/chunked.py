"""Completion log-probs without the whole vocabulary's logits: the output head, the softmax and the gather in
chunks of positions, forward and backward (the update's ``options.logprob_chunk``).

Scoring ``b`` rows of ``c`` completion tokens keeps ``b x c x V`` logits in float32, and autograd keeps their
softmax for the backward: for a 151k-token vocabulary and 8 x 1024 tokens, about 5 GB each. Here the model runs
with its output head set aside (it returns the final hidden states, ``b x c x H``), and
:func:`head_logprobs` computes each chunk's logits, log-probs of the given tokens and entropy, then drops
them; the backward recomputes each chunk's logits from the hidden states and the head's weight and adds that
chunk's gradients. The results are the plain path's (:mod:`nodes.models.tokens`: the same temperature, the
same ``suppress`` ids left out of the softmax) up to float rounding; tested against it, gradients included.

>>> import torch
>>> h, w = torch.randn(5, 4, requires_grad=True), torch.randn(7, 4, requires_grad=True)
>>> tok = torch.tensor([0, 3, 6, 1, 2])
>>> lp, ent = head_logprobs(h, w, None, tok, temperature=0.7, chunk=2)
>>> from nodes.models.tokens import token_logprobs
>>> bool(torch.allclose(lp, token_logprobs((h @ w.T)[None], tok[None], 0.7)[0], atol=1e-6))
True
"""

from __future__ import annotations

import contextlib

import torch

from omnigraph.sdk.adapters.transformers import plain_output_head

from nodes.models.tokens import _without


def head_logprobs(hidden, weight, bias, tokens, temperature: float = 1.0, suppress: list[int] | None = None,
                  chunk: int = 1024):
    """``(logprobs, entropy)`` ``[N]`` of ``tokens`` ``[N]`` under ``softmax((hidden @ weight.T + bias) / T)``,
    ``hidden`` ``[N, H]``, in chunks of ``chunk`` positions; the entropy carries no gradient."""
    return _HeadLogprobs.apply(hidden, weight, bias, tokens, float(temperature), suppress or None, int(chunk))


def _logp(h, weight, bias, temperature, suppress):
    logits = torch.nn.functional.linear(h, weight, bias).float()
    return torch.log_softmax(_without(logits, suppress) / temperature, dim=-1)


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, suppress, chunk):
        device = hidden.device.type
        ctx.amp = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        lp = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        ent = torch.empty_like(lp)
        for s in range(0, hidden.shape[0], chunk):
            logp = _logp(hidden[s:s + chunk], weight, bias, temperature, suppress)
            lp[s:s + chunk] = logp.gather(-1, tokens[s:s + chunk, None]).squeeze(-1)
            ent[s:s + chunk] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, tokens)
        ctx.temperature, ctx.suppress, ctx.chunk = temperature, suppress, chunk
        ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, bias, tokens = ctx.saved_tensors
        device, amp, amp_dtype = ctx.amp
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        g_h = torch.zeros_like(hidden) if want_h else None
        g_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        g_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
        with torch.autocast(device, dtype=amp_dtype, enabled=amp):
            for s in range(0, hidden.shape[0], ctx.chunk):
                h, g = hidden[s:s + ctx.chunk], g_lp[s:s + ctx.chunk].float()
                with torch.no_grad():
                    p = _logp(h, weight, bias, ctx.temperature, ctx.suppress).exp()
                # d lp / d logits = (one-hot(token) - p) / T; the suppressed ids' logits were replaced: no gradient
                g_logits = -p * g[:, None]
                g_logits.scatter_add_(1, tokens[s:s + ctx.chunk, None], g[:, None])
                g_logits /= ctx.temperature
                if ctx.suppress:
                    g_logits[:, ctx.suppress] = 0
                if want_h:
                    g_h[s:s + ctx.chunk] = (g_logits.to(weight.dtype) @ weight).to(hidden.dtype)
                if want_w:
                    g_w += g_logits.T @ h.float()
                if want_b:
                    g_b += g_logits.sum(0)
        return (g_h, None if g_w is None else g_w.to(weight.dtype), None if g_b is None else g_b.to(bias.dtype),
                None, None, None, None)


@contextlib.contextmanager
def hidden_states_out(model):
    """Within it, ``model``'s forward returns its final hidden states where it returned logits (its output head
    set aside, given as the context's value); the head is back on exit."""
    head = plain_output_head(model)
    if head is None:
        raise ValueError(f"{type(model).__name__}: its logits are not its output head's plain product (a scaled "
                         "or capped head, or an adapter on it): score it without options.logprob_chunk")
    model.set_output_embeddings(torch.nn.Identity())
    try:
        yield head
    finally:
        model.set_output_embeddings(head)
