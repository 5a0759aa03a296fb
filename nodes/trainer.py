"""Trainer-side nodes (backend ``torch``): old_logprob, ref_logprob, update, sync.

They share one :class:`Policy` per actor (``ctx.state.store["policy"]``): the
model being trained (optionally LoRA-wrapped with peft), its optimizer, and
the frozen reference model when a ``ref_logprob`` node asks for one.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from omnigraph.data import SampleBatch, Weights
from nodes import models
from nodes.hf import position_ids
from nodes.losses import entropy, masked_mean, policy_loss, token_logprobs


class Policy:
    def __init__(self, spec, update_spec):
        path = models.resolve(spec.model.path, spec.model.seed)
        torch.manual_seed(spec.runtime.seed)
        self.model, self.tok = models.load(path, spec.model.dtype)
        self.path = path
        self.lora = update_spec.lora if update_spec is not None else None
        if self.lora is not None:
            from peft import LoraConfig, get_peft_model
            self.model = get_peft_model(self.model, LoraConfig(r=self.lora.r, lora_alpha=self.lora.alpha,
                                                               target_modules=self.lora.target_modules))
        params = [p for p in self.model.parameters() if p.requires_grad]
        lr = update_spec.lr if update_spec is not None else 1e-3
        wd = update_spec.weight_decay if update_spec is not None else 0.0
        self.opt = torch.optim.AdamW(params, lr=lr, weight_decay=wd)
        self.ref = None

    @staticmethod
    def of(ctx) -> "Policy":
        store = ctx.state.store
        if "policy" not in store:
            upd = next((n for n in ctx.spec.nodes.values() if n.kind == "update"), None)
            store["policy"] = Policy(ctx.spec, upd)
        return store["policy"]

    def reference(self):
        if self.ref is None:
            self.ref, _ = models.load(self.path)
            self.ref.eval()
        return self.ref

    def logprobs(self, model, batch: SampleBatch, rows: slice, temperature: float, with_entropy: bool = False):
        """Per-token logprobs ``[b, C]`` of the completion tokens of ``rows``."""
        f = batch.fields
        P = batch.meta["prompt_len"]
        C = f["input_ids"].shape[1] - P
        # only as many completion columns as the longest completion of these rows: padding costs compute
        c = max(1, int(f["response_mask"][rows].sum(1).max()))
        ids, mask = f["input_ids"][rows, :P + c], f["attention_mask"][rows, :P + c]
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        logits = logits[:, P - 1:-1]
        pad = (0, C - c)
        lp = torch.nn.functional.pad(token_logprobs(logits, ids[:, P:], temperature), pad)
        if not with_entropy:
            return lp
        return lp, torch.nn.functional.pad(entropy(logits.detach(), temperature), pad)


def _micro(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class Logprob:
    """``old_logprob`` (the trainer's current weights) or ``ref_logprob`` (the initial weights), no grad."""

    def __init__(self, name, spec, ctx):
        self.spec, self.ctx = spec, ctx
        self.policy = Policy.of(ctx)

    def fusable(self, batch: SampleBatch) -> bool:
        """old_logprob == the update's own first forward when the update takes one optimizer step."""
        if self.spec.kind != "old_logprob":
            return False
        upd = next(n for n in self.ctx.spec.nodes.values() if n.kind == "update")
        per_rank = upd.mini_batch_size // self.ctx.world if upd.mini_batch_size else len(batch)
        return per_rank >= len(batch)

    @torch.no_grad()
    def __call__(self, step: int, batch: SampleBatch) -> dict:
        pol = self.policy
        if self.fusable(batch):
            # The update will take a single optimizer step, so the proximal policy is exactly the
            # weights its forward pass uses: it reads old_logprob from there (no second forward).
            batch.meta["old_logprob"] = "fused"
            return {"batch": batch}
        model = pol.model if self.spec.kind == "old_logprob" else pol.reference()
        was = model.training
        model.eval()
        T = batch.meta.get("temperature", 1.0)
        parts = [pol.logprobs(model, batch, s, T) for s in _micro(len(batch), self.spec.micro_batch_size)]
        model.train(was)
        key = "old_logprob" if self.spec.kind == "old_logprob" else "ref_logprob"
        lp = torch.cat(parts) * batch.fields["response_mask"]
        if key == "old_logprob":
            diff = (lp - batch.fields["logprob"]).abs() * batch.fields["response_mask"]
            self.ctx.log(behav_vs_old_logprob_maxdiff=float(diff.max()))
        return {"batch": batch.with_fields(**{key: lp})}


class Update:
    """PPO-clip with the decoupled correction (``nodes.losses``), AdamW, gradient clipping, micro-batches."""

    def __init__(self, name, spec, ctx):
        self.spec, self.ctx = spec, ctx
        self.policy = Policy.of(ctx)
        self.kl_coef = next((n.kl_coef for n in ctx.spec.nodes.values() if n.kind == "ref_logprob"), 0.0)

    def __call__(self, step: int, batch: SampleBatch) -> dict:
        s, pol = self.spec, self.policy
        model = pol.model
        model.train()
        f = batch.fields
        n = len(batch)
        if n == 0:                       # every sample dropped as too stale
            return {"weights": Weights(version=0)}
        T = batch.meta.get("temperature", 1.0)
        adv = torch.tensor(f["advantage"], dtype=torch.float32)
        behav = f["logprob"]
        fused = batch.meta.get("old_logprob") == "fused"
        old = f.get("old_logprob", behav)
        ref = f.get("ref_logprob")
        mask = f["response_mask"]
        mb = (s.mini_batch_size // self.ctx.world) if s.mini_batch_size else n
        stats: dict[str, list[float]] = {}
        for mini in _micro(n, mb):
            pol.opt.zero_grad(set_to_none=True)
            tokens = mask[mini].sum().clamp(min=1)
            for micro in _micro(mini.stop - mini.start, s.micro_batch_size):
                rows = slice(mini.start + micro.start, mini.start + micro.stop)
                lp, ent = pol.logprobs(model, batch, rows, T, with_entropy=True)
                proximal = lp.detach() * mask[rows] if fused else old[rows]
                if fused:
                    diff = float(((proximal - behav[rows]).abs() * mask[rows]).max())
                    stats.setdefault("behav_vs_old_logprob_maxdiff_max", []).append(diff)
                out = policy_loss(lp, proximal, behav[rows], adv[rows], mask[rows], clip=s.clip, is_cap=s.is_cap,
                                  ref_logprob=None if ref is None else ref[rows], kl_coef=self.kl_coef,
                                  denominator=tokens)
                out.loss.backward()
                w = float(mask[rows].sum() / tokens)
                for k in ("clip_frac", "ratio_mean", "is_mean", "kl"):
                    stats.setdefault(k, []).append(float(getattr(out, k)) * w)
                for k in ("ratio_max", "is_max"):
                    stats.setdefault(k, []).append(float(getattr(out, k)))
                stats.setdefault("loss", []).append(float(out.loss.detach()))
                stats.setdefault("entropy", []).append(float(masked_mean(ent, mask[rows])) * w)
            gn = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], s.max_grad_norm)
            stats.setdefault("grad_norm", []).append(float(gn))
            pol.opt.step()
        minis = len(_micro(n, mb))
        self.ctx.log(**{k: (max(v) if k.endswith("_max") else
                            sum(v) / (minis if k in ("clip_frac", "ratio_mean", "is_mean", "kl", "entropy",
                                                     "grad_norm") else 1))
                        for k, v in stats.items()})
        return {"weights": Weights(version=0)}

    def state_dict(self) -> dict:
        return {"model": self.policy.model.state_dict(), "opt": self.policy.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.model.load_state_dict(state["model"])
        self.policy.opt.load_state_dict(state["opt"])

    def save(self, run_dir: str) -> None:
        """The final weights, loadable with ``AutoModelForCausalLM.from_pretrained(run_dir/final)``."""
        out = Path(run_dir) / "final"
        model = self.policy.model
        if self.policy.lora is not None:
            model.save_pretrained(out / "adapter")
            model = model.merge_and_unload()
        model.save_pretrained(out, safe_serialization=True)
        self.policy.tok.save_pretrained(out)


class Sync:
    """Export the trainer's weights for the rollout: the full state dict, or LoRA adapter tensors only."""

    def __init__(self, name, spec, ctx):
        self.spec, self.ctx = spec, ctx
        self.policy = Policy.of(ctx)

    @torch.no_grad()
    def __call__(self, step: int, weights: Weights) -> dict:
        t0 = time.perf_counter()
        model = self.policy.model
        if self.spec.payload == "lora":
            from peft import get_peft_model_state_dict
            tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
        else:
            tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        self.ctx.log(sync_bytes=nbytes, sync_export_s=time.perf_counter() - t0)
        return {"weights": Weights(version=weights.version, tensors=tensors, payload=self.spec.payload,
                                   nbytes=nbytes)}
