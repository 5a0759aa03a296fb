"""The policy loss: PPO-clip on GRPO advantages, with the decoupled-PPO correction for stale samples.

Three policies meet in an asynchronous step (Hilton et al., "Batch size-invariance
for policy optimization", the decoupled PPO objective):

- the **behaviour** policy generated the sample (``behav_logprob``, from the rollout);
- the **proximal** policy is the trust-region anchor (``old_logprob``, the trainer's
  weights before this update);
- the **current** policy is being optimised (``logprob``).

Per token::

    ratio = exp(logprob - old_logprob)                      # PPO ratio vs the proximal policy
    w     = min(exp(old_logprob - behav_logprob), is_cap)   # truncated importance weight, no grad
    loss  = -w * min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)

With staleness 0 the proximal and behaviour policies are the same weights and
``w == 1``: plain PPO-clip. Token losses are aggregated as a mean over all
response tokens of the mini-batch ("token-mean").

What the correction sees is logged every step (:class:`LossOut`): the gap
``|old_logprob - behav_logprob|`` per token (mean and max: the sampler-trainer
gap on policy, the policy's drift since sampling when stale), the weights
(``is_mean``, ``is_max``) and the share of tokens whose weight the cap
truncated (``is_trunc_frac``). A stale sample one update old whose tokens moved
by several nats is far off-policy: the weight saturates at ``is_cap`` and the
update goes on regardless. What bounds that drift is the step size; the
gap's mean is the figure to watch when choosing ``lr`` for a staleness.

>>> import torch
>>> lp = torch.tensor([[0.0, 0.0]]); mask = torch.ones(1, 2)
>>> out = policy_loss(lp, lp, lp, torch.tensor([1.0]), mask, clip=0.2)
>>> float(out.loss), float(out.clip_frac)
(-1.0, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossOut:
    loss: torch.Tensor
    clip_frac: torch.Tensor
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor
    is_mean: torch.Tensor
    is_max: torch.Tensor
    kl: torch.Tensor
    is_trunc_frac: torch.Tensor
    """Share of the tokens whose importance weight ``exp(old - behav)`` exceeded ``is_cap`` (truncated)."""
    gap_mean: torch.Tensor
    """Mean of ``|old_logprob - behav_logprob|`` over the tokens, in nats."""
    gap_max: torch.Tensor


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(logprob: torch.Tensor, old_logprob: torch.Tensor, behav_logprob: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, *, clip: float = 0.2, is_cap: float = 2.0,
                ref_logprob: torch.Tensor | None = None, kl_coef: float = 0.0,
                denominator: torch.Tensor | float | None = None) -> LossOut:
    """PPO-clip with decoupled importance correction; shapes ``[batch, tokens]``, advantages ``[batch]``.

    ``denominator``: the token count to average over (default: this call's tokens); pass the
    mini-batch's total when the call is one micro-batch of several, so the sum is a token-mean.
    """
    adv = advantages.unsqueeze(-1).to(logprob.dtype)
    ratio = torch.exp(logprob - old_logprob)
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    raw = torch.exp(old_logprob - behav_logprob).detach()
    w = raw.clamp(max=is_cap)
    per_token = -w * surrogate
    kl = torch.zeros((), dtype=logprob.dtype)
    if ref_logprob is not None:
        # k3 estimator of KL(current || ref): exp(ref - cur) - (ref - cur) - 1 >= 0
        d = ref_logprob - logprob
        kl_tok = torch.exp(d) - d - 1
        kl = masked_mean(kl_tok.detach(), mask)
        if kl_coef:
            per_token = per_token + kl_coef * kl_tok
    denom = mask.sum().clamp(min=1) if denominator is None else denominator
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        is_clipped = ((ratio - clipped).abs() > 1e-9).to(logprob.dtype)
        big = torch.where(mask > 0, ratio, torch.zeros_like(ratio))
        wbig = torch.where(mask > 0, w, torch.zeros_like(w))
        gap = (old_logprob - behav_logprob).abs() * (mask > 0)
        out = LossOut(loss=loss, clip_frac=masked_mean(is_clipped, mask), ratio_mean=masked_mean(ratio, mask),
                      ratio_max=big.max(), is_mean=masked_mean(w, mask), is_max=wbig.max(), kl=kl,
                      is_trunc_frac=masked_mean((raw > is_cap).to(logprob.dtype), mask),
                      gap_mean=masked_mean(gap, mask), gap_max=gap.max())
    out.loss = loss
    return out
