"""``sync`` (backend ``torch``, role exporter): the trainer's weights as the generators load them.

The full state dict, or the LoRA adapter tensors only (``payload: lora``),
in the dtype the rollouts hold: bf16 from a mixed-precision trainer (its
fp32 master weights cast on the way), else as they are. How they travel is
the plan's choice (``plan.txt``: shm, cuda-ipc, nccl, host or channel); the
engine's transport carries what :meth:`Sync.state` returns (on a sharded pool every rank gathers, rank 0
sends): the same mapping every time while the model's
parameters are the same tensors (the optimizer writes them in place), so a transport that refills a
persistent buffer (``cuda-ipc``) matches the names once.
"""

from __future__ import annotations

import torch

from omnigraph.sdk import NodeContext, WeightsState

from nodes.policy import Policy
from nodes.sharded import gather


class Sync:
    def __init__(self, ctx: NodeContext):
        self.ctx, self.options = ctx, ctx.options
        self.payload = ctx.options.payload
        self.policy = Policy.of(ctx)
        self._tensors, self._of, self._params = None, None, []

    @torch.no_grad()
    def state(self) -> WeightsState | None:
        if self.policy.sharded:
            return self._gathered()
        model = self.policy.model
        params = list(model.parameters())       # walking the modules: ~1 ms for 290 tensors, once per export
        of = (model, [p.data_ptr() for p in params])
        swapped = len(params) != len(self._params) or any(a is not b for a, b in zip(params, self._params))
        if swapped or self._of != of:           # first export, a parameter replaced, or its memory replaced
            self._params = params
            if self.payload == "lora":
                from peft import get_peft_model_state_dict
                self._tensors = get_peft_model_state_dict(model)
            else:
                self._tensors = model.state_dict()
            self._of = of
        return WeightsState(self._tensors, self.payload, torch.bfloat16 if self.policy.autocast else None)

    def _gathered(self) -> WeightsState | None:
        """A sharded pool: every rank takes part in gathering the weights unit by unit; rank 0 keeps them, in
        the dtype the rollouts hold, in the same tensors each export (``nodes.sharded.gather``)."""
        pol = self.policy
        pol.prepare(self.ctx.collectives)
        model, keep = pol.model, self.ctx.rank == 0
        dtype = torch.bfloat16 if pol.autocast else None
        names = [k for k in model.state_dict() if "lora_" in k] if self.payload == "lora" else None
        full = gather(model, keep, dtype, names=names, into=self._tensors if keep else None)
        if not keep:
            return None
        self._tensors = full
        if self.payload == "lora":
            from peft import get_peft_model_state_dict
            full = get_peft_model_state_dict(model, state_dict=full)
        return WeightsState(full, self.payload, dtype)
