"""Trainer-side nodes (backend ``torch``): old_logprob, ref_logprob, update, sync.

They share one :class:`Policy` per actor (``ctx.state.store["policy"]``): the
model being trained (optionally LoRA-wrapped with peft), its optimizer, and
the frozen reference model when a ``ref_logprob`` node asks for one.

Devices and precision. The model, the optimizer state and every tensor of the
computation live on ``ctx.device`` (``cuda`` for a pool with ``gpus > 0``);
batches arrive as host tensors, are moved there once per call, and the
fields a node adds go back as host tensors. ``model.dtype: bfloat16`` is
mixed precision, on CUDA and on the CPU alike: fp32 master weights and fp32
AdamW state (fused kernel on CUDA), forward and backward under bf16
autocast, and ``sync`` exports the weights cast to bf16 (what the rollout
holds): AdamW steps of lr ~1e-6 on bf16 weights would mostly round away. On
a CPU with AMX or AVX512-BF16 the update runs ~1.8x faster than fp32
(SmolLM2-135M + LoRA, one core); on a CPU without them bf16 is emulated and
slower, and the trainer says so once.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from pathlib import Path

import torch

from omnigraph import dataparallel, weightsync
from omnigraph.data import SampleBatch, Weights
from omnigraph.tensors import TensorPack, to_device
from nodes import models
from nodes.hf import position_ids
from nodes.losses import entropy, masked_mean, policy_loss, token_logprobs


def _native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 - an older build: assume not
        return False


class Policy:
    def __init__(self, spec, update_spec, device: str = "cpu"):
        path = models.resolve(spec.model.path, spec.model.seed)
        torch.manual_seed(spec.runtime.seed)
        self.device = torch.device(device)
        self.dtype = spec.model.dtype
        self.autocast = self.dtype == "bfloat16"
        if self.autocast and self.device.type == "cpu" and not _native_bf16():
            print("trainer: this CPU has no native bf16 (AMX / AVX512-BF16): model.dtype bfloat16 runs "
                  "emulated, slower than float32", flush=True)
        self.model, self.tok = models.load(path, "float32" if self.autocast else self.dtype, self.device)
        self.path = path
        self.lora = update_spec.lora if update_spec is not None else None
        if self.lora is not None:
            from peft import LoraConfig, get_peft_model
            self.model = get_peft_model(self.model, LoraConfig(r=self.lora.r, lora_alpha=self.lora.alpha,
                                                               target_modules=self.lora.target_modules))
        params = [p for p in self.model.parameters() if p.requires_grad]
        lr = update_spec.lr if update_spec is not None else 1e-3
        wd = update_spec.weight_decay if update_spec is not None else 0.0
        self.opt = torch.optim.AdamW(params, lr=lr, weight_decay=wd, fused=self.device.type == "cuda")
        self.ref = None
        self.exports: deque = deque(maxlen=3)
        """The last weight exports, kept alive while a receiver may still be opening them (cuda-ipc, shm):
        with two steps in flight, a receiver has opened every export older than the newest two."""

    @staticmethod
    def of(ctx) -> "Policy":
        store = ctx.state.store
        if "policy" not in store:
            upd = next((n for n in ctx.spec.nodes.values() if n.kind == "update"), None)
            store["policy"] = Policy(ctx.spec, upd, ctx.device)
        return store["policy"]

    def reference(self):
        if self.ref is None:
            self.ref, _ = models.load(self.path, "bfloat16" if self.autocast else "float32", self.device)
            self.ref.eval()
        return self.ref

    def amp(self):
        """bf16 autocast when ``model.dtype`` is bfloat16 (see the module docstring)."""
        if self.autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def on_device(self, batch: SampleBatch) -> SampleBatch:
        """The batch with its tensor fields on the trainer's device (the same batch on the CPU)."""
        if self.device.type == "cpu":
            return batch
        return batch.with_fields(**{k: to_device(v, self.device) for k, v in batch.fields.items()
                                    if isinstance(v, torch.Tensor)})

    def logprobs(self, model, batch: SampleBatch, rows: slice, temperature: float, with_entropy: bool = False):
        """Per-token logprobs ``[b, C]`` of the completion tokens of ``rows`` (``batch`` on the device)."""
        f = batch.fields
        P = batch.meta["prompt_len"]
        C = f["input_ids"].shape[1] - P
        # only as many completion columns as the longest completion of these rows: padding costs compute
        c = max(1, int(f["response_mask"][rows].sum(1).max()))
        ids, mask = f["input_ids"][rows, :P + c], f["attention_mask"][rows, :P + c]
        with self.amp():
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
        dev = pol.on_device(batch)
        parts = [pol.logprobs(model, dev, s, T) for s in _micro(len(batch), self.spec.micro_batch_size)]
        model.train(was)
        key = "old_logprob" if self.spec.kind == "old_logprob" else "ref_logprob"
        lp = torch.cat(parts) * dev.fields["response_mask"]
        if key == "old_logprob":
            diff = (lp - dev.fields["logprob"]).abs() * dev.fields["response_mask"]
            self.ctx.log(behav_vs_old_logprob_maxdiff=float(diff.max()))
        return {"batch": batch.with_fields(**{key: lp.cpu()})}


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
        n = len(batch)
        dp = dataparallel.of(self.ctx)   # several trainer actors: one optimizer over the whole batch
        if n == 0 and dp is None:        # every sample dropped as too stale
            return {"weights": Weights(version=0)}
        batch = pol.on_device(batch)
        f = batch.fields
        T = batch.meta.get("temperature", 1.0)
        adv = torch.tensor(f["advantage"], dtype=torch.float32, device=pol.device)
        behav = f["logprob"]
        fused = batch.meta.get("old_logprob") == "fused"
        old = f.get("old_logprob", behav)
        ref = f.get("ref_logprob")
        mask = f["response_mask"]
        mb = (s.mini_batch_size // self.ctx.world) if s.mini_batch_size else n
        if dp is None:
            minis = _micro(n, mb)
        elif s.mini_batch_size:          # the ranks take the same number of optimizer steps
            steps = dataparallel.all_max(dp, len(_micro(n, mb)), pol.device)
            minis = [slice(min(i * mb, n), min((i + 1) * mb, n)) for i in range(steps)]
        else:
            minis = [slice(0, n)]
        params = [p for p in model.parameters() if p.requires_grad]
        stats: dict[str, list[float]] = {}
        for mini in minis:
            pol.opt.zero_grad(set_to_none=True)
            tokens = mask[mini].sum()
            if dp is not None:           # the whole mini-batch's tokens: the loss is summed over ranks
                tokens = torch.tensor(dataparallel.all_sum(dp, float(tokens), pol.device), device=pol.device)
            tokens = tokens.clamp(min=1)
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
            if dp is not None:
                dataparallel.sum_grads(dp, params)
            gn = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
            stats.setdefault("grad_norm", []).append(float(gn))
            pol.opt.step()
        minis = max(1, len(minis))
        if pol.device.type == "cuda":
            stats["gpu_mem_gb"] = [torch.cuda.max_memory_allocated(pol.device) / 1e9]
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
        """The final weights, loadable with ``AutoModelForCausalLM.from_pretrained(run_dir/final)``
        (rank 0 of a data-parallel pool: the ranks hold the same weights)."""
        if self.ctx.rank != 0:
            return
        out = Path(run_dir) / "final"
        model = self.policy.model
        if self.policy.lora is not None:
            model.save_pretrained(out / "adapter")
            model = model.merge_and_unload()
        model.save_pretrained(out, safe_serialization=True)
        self.policy.tok.save_pretrained(out)


class Sync:
    """Export the trainer's weights for the rollout: the full state dict, or LoRA adapter tensors only.

    On the CPUs of one host: a :class:`~omnigraph.tensors.TensorPack` in a ``/dev/shm`` file (path ``shm``:
    only its name crosses; tied weights once); on a cluster, a dict of cloned tensors through the
    channel. On a GPU the path is chosen from the placement (:func:`omnigraph.weightsync.weights_path`):

    - ``nccl`` (trainer and rollout on whole GPUs of their own): the bytes go by NCCL broadcast in buckets
      of ``bucket_mb`` (:mod:`omnigraph.weightsync`) and the value returned is their description only;
      without a group (the ``local`` executor: one process) the pack is handed over in-process;
    - ``cuda-ipc`` (sharing a card), ``device`` or ``host``: a :class:`~omnigraph.tensors.TensorPack` in the
      rollout's dtype, one flat buffer.
    """

    def __init__(self, name, spec, ctx):
        self.name, self.spec, self.ctx = name, spec, ctx
        self.policy = Policy.of(ctx)
        self.path = weightsync.weights_path(ctx.spec, name)
        self._told = False
        self._meta = None

    @staticmethod
    def _wire(pol):
        """The dtype weights travel in: bf16 from a mixed-precision trainer (fp32 masters), else as they are."""
        return torch.bfloat16 if pol.autocast else None

    @torch.no_grad()
    def __call__(self, step: int, weights: Weights) -> dict:
        t0 = time.perf_counter()
        pol = self.policy
        model = pol.model
        if self.spec.payload == "lora":
            from peft import get_peft_model_state_dict
            state = get_peft_model_state_dict(model)
        else:
            state = model.state_dict()
        path = self.path
        if path == "nccl":
            group = weightsync.group(weightsync.group_name(self.name))
            if group is not None:
                if self._meta is None:
                    self._meta = weightsync.describe(state, group.name, dtype=getattr(torch, pol.dtype),
                                                     bucket_bytes=int(self.spec.bucket_mb * (1 << 20)))
                weightsync.send(self._meta, state, group)
                tensors, nbytes = self._meta, self._meta.nbytes
            else:
                path = "device"          # one process (local executor): no group, no copy through NCCL
        if path != "nccl" and pol.device.type == "cuda":
            tensors = TensorPack.pack(state, dtype=getattr(torch, pol.dtype), path=path)
            if path == "host":
                tensors = TensorPack({k: b.cpu() for k, b in tensors.buffers.items()}, tensors.layout, "host")
            torch.cuda.current_stream(pol.device).synchronize()
            pol.exports.append(tensors)
            nbytes = tensors.nbytes
        elif path == "shm":
            tensors = TensorPack.pack(state, dtype=self._wire(pol), path="shm")
            pol.exports.append(tensors)
            nbytes = tensors.nbytes
        elif path != "nccl":
            wire = self._wire(pol)
            tensors = {k: v.detach().to(wire if wire is not None and v.is_floating_point() else v.dtype, copy=True)
                       for k, v in state.items()}
            nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if not self._told and pol.device.type == "cuda":
            how = f" in {len(tensors.buckets)} buckets of <= {self.spec.bucket_mb:g} MB" if path == "nccl" else ""
            print(f"sync: weights travel by {path}{how} ({nbytes / 1e6:.1f} MB, {pol.dtype})", flush=True)
            self._told = True
        self.ctx.log(sync_bytes=nbytes, sync_export_s=time.perf_counter() - t0)
        return {"weights": Weights(version=weights.version, tensors=tensors, payload=self.spec.payload,
                                   nbytes=nbytes)}


