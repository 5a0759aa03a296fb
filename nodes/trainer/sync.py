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
from omnigraph.sdk.adapters.torch import own_parameters

from nodes.trainer.policy import Policy
from nodes.trainer.sharded import gather


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
        if not self._same(model):               # first export, a parameter replaced, or its memory replaced
            # where each parameter sits: checking these is ~0.1 ms; walking the modules again was ~1.8 ms
            # (Qwen2.5-0.5B's 290 tensors, H100 host), once per export
            self._params = [(m, n, p) for m in model.modules() for n, p in own_parameters(m).items() if p is not None]
            self._of = (model, [p.data_ptr() for _, _, p in self._params])
            if self.payload == "lora":
                from peft import get_peft_model_state_dict
                self._tensors = get_peft_model_state_dict(model)
            else:
                self._tensors = model.state_dict()
        return WeightsState(self._tensors, self.payload, torch.bfloat16 if self.policy.autocast else None)

    def _same(self, model) -> bool:
        """Whether ``model``'s parameters are the objects and memory of the last export (the optimizer writes
        them in place; a load that replaces a parameter, or moves it, does not)."""
        if self._of is None or self._of[0] is not model:
            return False
        return all(own_parameters(m).get(n) is p and p.data_ptr() == ptr
                   for (m, n, p), ptr in zip(self._params, self._of[1]))

    def _gathered(self) -> WeightsState | None:
        """A sharded pool: every rank takes part in gathering the weights unit by unit; rank 0 keeps them, in
        the dtype the rollouts hold, in the same tensors each export (``nodes.trainer.sharded.gather``)."""
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
