"""``old_logprob`` and ``ref_logprob`` (backend ``torch``, role logprob): per-token logprobs, no grad.

``old_logprob`` scores the batch under the trainer's current weights (the
proximal policy of the decoupled PPO loss); when the update takes a single
optimizer step those are exactly the weights of the update's own first
forward, so it fuses into it instead of running a second forward.
``ref_logprob`` scores it under the initial weights (the KL reference).
"""

from __future__ import annotations

import torch

from omnigraph.sdk import NodeContext, SampleBatch

from nodes.trainer.policy import Policy, micro
from nodes.trainer.sharded import idle_pass, lockstep


class Logprob:
    """``old_logprob`` (the trainer's current weights) or ``ref_logprob`` (the initial weights), no grad."""

    def __init__(self, ctx: NodeContext):
        self.ctx, self.options = ctx, ctx.options
        self.old = ctx.kind == "old_logprob"
        self.policy = Policy.of(ctx)

    def fusable(self, batch: SampleBatch) -> bool:
        """old_logprob == the update's own first forward when the update takes one optimizer step."""
        if not self.old:
            return False
        n = len(batch)
        if self.policy.sharded:          # the ranks decide alike: a forward of a sharded model is a collective
            n = self.ctx.collectives.all_max(n)
        mb = self.ctx.policy.mini_batch_size
        per_rank = mb // self.ctx.world if mb else n
        return per_rank >= n

    @torch.no_grad()
    def logprobs(self, step: int, batch: SampleBatch) -> SampleBatch:
        pol = self.policy
        pol.prepare(self.ctx.collectives)
        if self.fusable(batch):
            # The update will take a single optimizer step, so the proximal policy is exactly the
            # weights its forward pass uses: it reads old_logprob from there (no second forward).
            batch.meta["old_logprob"] = "fused"
            return batch
        model = pol.model if self.old else pol.reference()
        was = model.training
        model.eval()
        T = batch.meta.get("temperature", 1.0)
        dev = pol.on_device(batch)
        rows = micro(len(batch), self.options.micro_batch_size)
        if pol.sharded and self.old:     # every rank as many forwards as the longest share needs
            rows = lockstep(rows, self.ctx.collectives)
        share = self.options.share_prompts
        parts = [pol.logprobs(model, dev, s, T, share=share) for s in rows if s is not None]
        for _ in range(len(rows) - len(parts)):
            idle_pass(model, pol.device, backward=False)
        model.train(was)
        key = "old_logprob" if self.old else "ref_logprob"
        mask = dev.fields["response_mask"]
        lp = torch.cat(parts) * mask if parts else torch.zeros(mask.shape, device=mask.device)  # no rows: all dropped
        if key == "old_logprob" and parts:
            diff = (lp - dev.fields["logprob"]).abs() * dev.fields["response_mask"]
            self.ctx.log(behav_vs_old_logprob_maxdiff=float(diff.max()))
        return batch.with_fields(**{key: lp.cpu()})
