"""``update`` (backend ``torch``, role trainer): one PPO update of the policy per batch.

PPO-clip on GRPO advantages with the decoupled correction (:mod:`nodes.trainer.losses`:
proximal policy = ``old_logprob``, behaviour policy = the rollout's sampling
logprobs, truncated importance weight ``is_cap``), token-mean loss, AdamW,
gradient clipping, mini- and micro-batches. With several trainer actors
(``ctx.collectives``) the ranks train as one optimizer: the same number of
mini-batches, each loss divided by the whole mini-batch's tokens, gradients
summed over the ranks before clipping. On a sharded pool (``sharding: fsdp``,
:mod:`nodes.trainer.sharded`) FSDP2 reduce-scatters the same sums into each rank's
shard, and the ranks run their micro-batches in lockstep.

A NaN or inf is never trained on (:mod:`nodes.nonfinite`): the batch's advantages and log-probs are checked
before the step, the gradients after each backward pass (their total norm, which any NaN or inf makes
non-finite); either way the rest of the step's update is skipped (a mini-batch's optimizer step already
taken before a bad one stands), all ranks alike (the flag is summed over them), and counted in the
trainer's state (``nonfinite_skipped``, ``nonfinite_in_a_row``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from omnigraph.sdk import NodeContext, SampleBatch

from nodes import models
from nodes.nonfinite import Streak, count_tensor, poison, warn
from nodes.trainer.losses import masked_mean, policy_loss
from nodes.trainer import UpdateOptions
from nodes.trainer.policy import Policy, micro, token_micro
from nodes.trainer.sharded import gather, idle_pass, load_local, local_state, lockstep, state_bytes


PER_MINI_BATCH = ("clip_frac", "ratio_mean", "is_mean", "kl", "entropy", "grad_norm", "is_trunc_frac",
                  "behav_vs_old_logprob_absdiff_mean")
"""Statistics that are token means within a mini-batch: the step logs their mean over its mini-batches."""


class Update:
    """PPO-clip with the decoupled correction (``nodes.trainer.losses``), AdamW, gradient clipping, micro-batches."""

    def __init__(self, ctx: NodeContext):
        self.ctx, self.options = ctx, ctx.options
        self.policy = Policy.of(ctx)
        self.kl_coef = ctx.policy.kl_coef
        self.nonfinite = Streak()
        self.settings = ctx.backend_options or UpdateOptions()
        self.policy.chunk = self.settings.logprob_chunk
        if self.settings.activation_checkpointing:     # each layer's activations recomputed in the backward
            self.policy.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.policy.model.config.use_cache = False            # no KV cache is kept in a training forward

    def train(self, step: int, batch: SampleBatch) -> None:
        s, pol = self.options, self.policy
        model = pol.model
        model.train()
        t0 = time.perf_counter()
        if pol.encoder is not None:
            pol.encoder.take()
        n = len(batch)
        dp = self.ctx.collectives        # several trainer actors: one optimizer over the whole batch
        pol.prepare(dp)
        sharded = pol.sharded
        if n == 0 and dp is None:        # every sample dropped as too stale
            return
        batch = pol.on_device(batch)
        f = batch.fields
        T = batch.meta.get("temperature", 1.0)
        adv = torch.tensor(f["advantage"], dtype=torch.float32, device=pol.device)
        behav = f["logprob"]
        fused = batch.meta.get("old_logprob") == "fused"
        old = f.get("old_logprob", behav)
        ref = f.get("ref_logprob")
        adv, behav, old = self._corrupt(adv, behav, old, fused)
        inputs = {"advantage": adv, "logprob": behav, "old_logprob": None if fused else old, "ref_logprob": ref}
        if self._skip(step, {k: count_tensor(t) for k, t in inputs.items() if t is not None}):
            return
        mask = f["response_mask"]
        mb = (s.mini_batch_size // self.ctx.world) if s.mini_batch_size else n
        if dp is None:
            minis = micro(n, mb)
        elif s.mini_batch_size:          # the ranks take the same number of optimizer steps
            steps = dp.all_max(len(micro(n, mb)))
            minis = [slice(min(i * mb, n), min((i + 1) * mb, n)) for i in range(steps)]
        else:
            minis = [slice(0, n)]
        params = [p for p in model.parameters() if p.requires_grad]
        stats: dict[str, list[float]] = {}
        for mini in minis:
            pol.opt.zero_grad(set_to_none=True)
            tokens = mask[mini].sum()
            if dp is not None:           # the whole mini-batch's tokens: the loss is summed over ranks
                tokens = torch.tensor(dp.all_sum(float(tokens)), device=pol.device)
            tokens = tokens.clamp(min=1)
            parts = self._parts(batch, mini)
            for part in (lockstep(parts, dp) if sharded else parts):
                if part is None:         # a peer has one more micro-batch: take part in its collectives
                    idle_pass(model, pol.device, backward=True)
                    continue
                rows = slice(mini.start + part.start, mini.start + part.stop)
                lp, ent = pol.logprobs(model, batch, rows, T, with_entropy=True,
                                       share=s.share_prompts and not self.settings.activation_checkpointing)
                proximal = lp.detach() * mask[rows] if fused else old[rows]
                out = policy_loss(lp, proximal, behav[rows], adv[rows], mask[rows], clip=s.clip, is_cap=s.is_cap,
                                  ref_logprob=None if ref is None else ref[rows], kl_coef=self.kl_coef,
                                  denominator=tokens)
                out.loss.backward()
                w = float(mask[rows].sum() / tokens)
                for k in ("clip_frac", "ratio_mean", "is_mean", "kl", "is_trunc_frac"):
                    stats.setdefault(k, []).append(float(getattr(out, k)) * w)
                for k in ("ratio_max", "is_max"):
                    stats.setdefault(k, []).append(float(getattr(out, k)))
                # the sampler's log-probs against the proximal policy's: the sampler-trainer gap, plus the drift
                # of the policy since sampling where the sample is stale (mean and max over the tokens, nats)
                stats.setdefault("behav_vs_old_logprob_absdiff_mean", []).append(float(out.gap_mean) * w)
                stats.setdefault("behav_vs_old_logprob_maxdiff_max", []).append(float(out.gap_max))
                stats.setdefault("loss", []).append(float(out.loss.detach()))
                stats.setdefault("entropy", []).append(float(masked_mean(ent, mask[rows])) * w)
            if self.ctx.fault("after_backward"):        # a test's NaN in a gradient
                _poison_grad(params)
            if dp is not None and not sharded:   # sharded: FSDP2 reduce-scattered them in the backward
                dp.sum_grads(params)
            grads = [p.grad for p in params if p.grad is not None]
            gn = torch.nn.utils.get_total_norm(grads)       # any NaN or inf makes it non-finite: no extra pass
            bad = 0 if math.isfinite(float(gn)) else sum(map(count_tensor, grads)) or 1    # 1: the norm overflowed
            if self._skip(step, {"gradients": bad}):
                pol.opt.zero_grad(set_to_none=True)
                return
            stats.setdefault("grad_norm", []).append(float(gn))
            if float(gn) == 0.0:
                # no signal (every advantage zero: each group's samples scored alike): an optimizer step would
                # still move the weights by its momentum and weight decay, a drift no sample asked for
                stats.setdefault("no_signal_steps", []).append(1.0)
                continue
            torch.nn.utils.clip_grads_with_norm_(params, s.max_grad_norm, gn)
            pol.opt.step()
        self.ctx.log(**self.nonfinite.record(False))
        minis = max(1, len(minis))
        took = time.perf_counter() - t0
        trained = float(f["attention_mask"].sum())          # the tokens through forward and backward
        self.ctx.log(update_tokens_per_s=trained / max(took, 1e-9))
        if pol.device.type == "cuda":
            stats["gpu_mem_gb"] = [torch.cuda.max_memory_allocated(pol.device) / 1e9]
            # model FLOPs utilisation: 6 x parameters x tokens/s over the card's dense bf16 rate, measured here
            params = sum(p.numel() for p in model.parameters())
            stats["mfu"] = [6 * params * trained / max(took, 1e-9) / card_flops(pol.device)]
        stats["trainer_state_mb"] = [state_bytes(model, pol.opt) / 2 ** 20]   # this rank's share (its shards)
        self.ctx.log(**{k: (max(v) if k.endswith("_max") else
                            sum(v) / (minis if k in PER_MINI_BATCH else 1) if k != "trainer_state_mb" else v[0])
                        for k, v in stats.items()})
        if pol.encoder is not None:          # the vision tower's forwards: their share of this update
            secs = pol.encoder.take()[0]
            self.ctx.log(update_encoder_s=secs, update_encoder_share=secs / max(time.perf_counter() - t0, 1e-9))

    def _parts(self, batch: SampleBatch, mini: slice) -> list[slice]:
        """The micro-batches of a mini-batch: ``micro_batch_size`` rows, or a token budget
        (``options.micro_batch_tokens``)."""
        s, n = self.options, mini.stop - mini.start
        if self.settings.micro_batch_tokens is None:
            return micro(n, s.micro_batch_size)
        P = batch.meta["prompt_len"]
        lengths = batch.fields["attention_mask"][mini, P:].sum(1).tolist()
        return token_micro(lengths, P, self.settings.micro_batch_tokens, s.micro_batch_size)

    # -- the guard against non-finite values (nodes.nonfinite) -------------------------------------------
    def _corrupt(self, adv, behav, old, fused: bool):
        """The fault points of a test's ``corrupt``: one advantage, sampler log-prob or old log-prob made NaN
        (``old_logprob`` only where it is a field of its own: not fused into this update)."""
        if self.ctx.fault("advantage"):
            adv = poison(adv)
        if self.ctx.fault("logprob"):
            behav = poison(behav)
        if not fused and self.ctx.fault("old_logprob"):
            old = poison(old)
        return adv, behav, old

    def _skip(self, step: int, found: dict[str, int]) -> bool:
        """Whether this step's update stops here: non-finite values on this rank (``found``: tensor ->
        count) or on any other (a flag summed over the ranks: every rank takes the same branch). A skip is
        warned about, counted and logged."""
        found = {k: n for k, n in found.items() if n}
        dp = self.ctx.collectives
        anywhere = dp.all_sum(float(bool(found))) if dp is not None else float(bool(found))
        if not anywhere:
            return False
        warn(self.ctx.name, f"step {step}", found, "the update is skipped")
        self.ctx.log(**self.nonfinite.record(True))
        return True

    def state_dict(self) -> dict:
        self.policy.prepare(self.ctx.collectives)
        if self.policy.sharded:          # this rank's shards only
            return {**local_state(self.policy.model, self.policy.opt), "nonfinite": self.nonfinite.state_dict()}
        return {"model": self.policy.model.state_dict(), "opt": self.policy.opt.state_dict(),
                "nonfinite": self.nonfinite.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.prepare(self.ctx.collectives)
        self.nonfinite.load_state_dict(state.get("nonfinite"))
        if self.policy.sharded:
            load_local(self.policy.model, self.policy.opt, state)
            return
        self.policy.model.load_state_dict(state["model"])
        self.policy.opt.load_state_dict(state["opt"])

    def save(self, run_dir: str) -> None:
        """The final weights, loadable with ``AutoModelForCausalLM.from_pretrained(run_dir/final)``
        (rank 0 of a data-parallel pool: the ranks hold the same weights; of a sharded pool: every rank
        takes part in gathering them)."""
        model = self._whole()
        if self.ctx.rank != 0:
            return
        out = Path(run_dir) / "final"
        with models.quiet_bars():
            if self.policy.lora is not None:
                model.save_pretrained(out / "adapter")
                model = model.merge_and_unload()
            model.save_pretrained(out, safe_serialization=True)
            self.policy.tok.save_pretrained(out)

    def _whole(self):
        """The model to save: the trained one, or on a sharded pool a copy built on rank 0 from the gathered
        shards (every rank takes part; the others get None)."""
        pol = self.policy
        if not pol.sharded:
            return pol.model
        pol.prepare(self.ctx.collectives)
        full = gather(pol.model, keep=self.ctx.rank == 0)
        if full is None:
            return None
        model, _ = models.load(pol.path, "float32", "cpu")
        if pol.lora is not None:
            model = models.with_lora(model, pol.lora)
        model.load_state_dict(full)
        return model


_CARD_FLOPS: dict[str, float] = {}


@torch.no_grad()
def card_flops(device) -> float:
    """The card's dense bf16 rate, FLOP/s: an 8192^3 matrix product timed once per process (after a warm-up)."""
    key = str(device)
    if key not in _CARD_FLOPS:
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        a @ a
        torch.cuda.synchronize(device)
        t0, reps = time.perf_counter(), 5
        for _ in range(reps):
            a @ a
        torch.cuda.synchronize(device)
        _CARD_FLOPS[key] = 2 * 8192 ** 3 * reps / (time.perf_counter() - t0)
    return _CARD_FLOPS[key]


@torch.no_grad()
def _poison_grad(params) -> None:
    """A test's ``corrupt`` after the backward pass: the first value of the first gradient this rank holds
    becomes NaN."""
    for p in params:
        g = p.grad.to_local() if p.grad is not None and hasattr(p.grad, "to_local") else p.grad
        if g is not None and g.numel():
            g.view(-1)[0] = float("nan")
            return
