"""The trainer's policy (backend ``torch``), shared by the nodes of the trainer's actor.

``old_logprob`` (:mod:`nodes.trainer.logprob`), ``update`` (:mod:`nodes.trainer.update`) and
``sync`` (:mod:`nodes.trainer.sync`) share one :class:`Policy` per actor
(``ctx.shared["policy"]``): the model being trained (optionally LoRA-wrapped
with peft), its optimizer, and the frozen reference model when a
``ref_logprob`` node asks for one.

Devices and precision. The model, the optimizer state and every tensor of the
computation live on ``ctx.device`` (``cuda`` for a pool with ``gpus > 0``);
batches arrive as host tensors, are moved there once per call, and the
fields a node adds go back as host tensors. ``model.dtype: bfloat16`` is
mixed precision, on CUDA and on the CPU alike: fp32 master weights and fp32
AdamW state (the fused kernel), forward and backward under bf16
autocast, and ``sync`` exports the weights cast to bf16 (what the rollout
holds): AdamW steps of lr ~1e-6 on bf16 weights would mostly round away. On
a CPU with AMX or AVX512-BF16 the update runs ~1.8x faster than fp32
(SmolLM2-135M + LoRA, one core); on a CPU without them bf16 is emulated and
slower, and the trainer says so once.

On a pool with ``sharding: fsdp`` the model is sharded with FSDP2 (:mod:`nodes.trainer.sharded`) before its
first use, and the optimizer is made over the shards.
"""

from __future__ import annotations

import contextlib

import torch

from omnigraph.sdk import ConfigError, NodeContext, SampleBatch
from omnigraph.sdk.adapters import torch as torch_adapter
from omnigraph.sdk.adapters.transformers import keeps_tower_output

from nodes import models
from nodes.models import vision
from nodes.trainer import sharded
from nodes.trainer.buckets import length_buckets
from nodes.models.tokens import entropy, token_logprobs
from nodes.models.chunked import head_logprobs, hidden_states_out
from nodes.models.picture_cache import FeatureCache
from nodes.models.prefix import completion_logits, positions


def _native_bf16() -> bool:
    return torch_adapter.mkldnn_bf16_supported()


def to_device(value, device):
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value


def micro(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def token_micro(lengths: list[int], prompt_len: int, budget: int, size: int) -> list[slice]:
    """Consecutive micro-batches of rows whose padded tokens, rows x (``prompt_len`` + their longest completion),
    stay within ``budget`` (a row over it alone), at most ``size`` rows each.

    >>> token_micro([4, 4, 30, 2, 2, 2], prompt_len=10, budget=60, size=16)
    [slice(0, 2, None), slice(2, 3, None), slice(3, 6, None)]
    >>> token_micro([4, 4, 30], prompt_len=10, budget=20, size=16)
    [slice(0, 1, None), slice(1, 2, None), slice(2, 3, None)]
    """
    out, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        wider = max(longest, n)
        if i > start and ((i - start + 1) * (prompt_len + wider) > budget or i - start >= size):
            out.append(slice(start, i))
            start, wider = i, n
        longest = wider
    if lengths:
        out.append(slice(start, len(lengths)))
    return out


class Policy:
    def __init__(self, ctx: NodeContext):
        path = ctx.model.dir
        torch.manual_seed(ctx.seed)
        self.device = torch.device(ctx.device)
        self.dtype = ctx.model.dtype
        self.autocast = self.dtype == "bfloat16"
        if self.autocast and self.device.type == "cpu" and not _native_bf16():
            print("trainer: this CPU has no native bf16 (AMX / AVX512-BF16): model.dtype bfloat16 runs "
                  "emulated, slower than float32", flush=True)
        self.model, self.tok = models.load(path, "float32" if self.autocast else self.dtype, self.device)
        self.path = path
        self.lora = ctx.policy.lora
        if self.lora is not None:
            self.model = models.with_lora(self.model, self.lora)
        if "vision" in ctx.model.freeze:
            self._freeze_tower(ctx.model.name)
        self.sharded = ctx.sharding == "fsdp"
        # a frozen tower's output, computed once per sample's pictures and kept (nodes.models.picture_cache)
        self.features = FeatureCache(self.model) if "vision" in ctx.model.freeze and not self.sharded and \
            keeps_tower_output(self.model) else None
        # an image-text model: its vision tower's forward time, for the update's share (nodes.models.vision)
        self.encoder = vision.EncoderClock(self.model) if vision.is_vision(path) else None
        self.chunk: int | None = None    # positions per chunk of the output head (the update's options)
        self.suppress = vision.placeholder_ids(self.model) if vision.is_vision(path) else None   # never sampled
        if self.lora is None and not self.sharded:
            models.contiguous(self.model)       # sync exports it in one cast (its pack has the same order)
        self.lr, self.weight_decay = ctx.policy.lr, ctx.policy.weight_decay
        # a sharded model gets its optimizer once it is sharded (prepare): AdamW holds its DTensor shards
        self.opt = None if self.sharded else self._optimizer()
        self.ref = None

    def _freeze_tower(self, name: str) -> None:
        """``model.freeze: [vision]``: no gradient, so no update, for the vision tower (nor its LoRA adapters)."""
        tower = vision.tower(self.model)
        if tower is None:
            raise ConfigError(f"'{name}' has no vision tower to freeze", where="model.freeze",
                              fix="remove vision from model.freeze, or use an image-text model")
        for p in tower.parameters():
            p.requires_grad_(False)

    def _optimizer(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        # the fused kernel (one pass over each tensor) on CUDA, and on the CPU where the model is not sharded
        fused = self.device.type == "cuda" or not self.sharded
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, fused=fused)

    def prepare(self, collectives) -> None:
        """On a sharded pool (``sharding: fsdp``): shard the model over the pool's mesh, once, when its
        process group exists (it forms after the nodes are built). Every node of the pool calls it first."""
        if not self.sharded or self.opt is not None:
            return
        if collectives is None:
            raise RuntimeError("a sharded trainer needs its pool's process group (the ray executors form it)")
        sharded.shard(self.model, collectives.mesh())
        self.opt = self._optimizer()

    @staticmethod
    def of(ctx: NodeContext) -> "Policy":
        """The actor's policy (built by the first of its nodes that asks)."""
        if "policy" not in ctx.shared:
            ctx.shared["policy"] = Policy(ctx)
        return ctx.shared["policy"]

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

    def logprobs(self, model, batch: SampleBatch, rows: slice, temperature: float, with_entropy: bool = False,
                 share: bool = True, split: bool = True):
        """Per-token logprobs ``[b, C]`` of the completion tokens of ``rows`` (``batch`` on the device), and
        with ``with_entropy`` the entropies. ``share``: each distinct prompt runs once (:mod:`nodes.models.prefix`);
        ``split``: short and long completions in forwards of their own where that saves padding
        (:mod:`nodes.trainer.buckets`). Neither on a sharded model: its forward is a collective, and every rank
        must run as many."""
        f = batch.fields
        P = batch.meta["prompt_len"]
        share, split = share and not self.sharded, split and not self.sharded
        # a row's completion tokens (the attention mask: a multi-turn episode's environment tokens count,
        # though they are not trained)
        lengths = f["attention_mask"][rows, P:].sum(1)
        ids, mask = f["input_ids"][rows], f["attention_mask"][rows]
        # prompts with pictures: each row's pixel values, and a key that tells rows of different pictures apart
        pix = f["pixel_values"][rows] if "pixel_values" in f else None
        keys = f["image_key"][rows].to(ids.device) if "image_key" in f else None
        if share and pix is not None and self.suppress and \
                torch.isin(ids[:, P:], torch.tensor(self.suppress, device=ids.device)).any():
            share = False        # pictures after the prompt (an agent's later turns) are read in the rows' forward
        parts = None
        if split:
            prompts = len(torch.unique(ids[:, :P], dim=0)) if share and P else len(ids)
            parts = length_buckets(lengths, overhead=64 + (P * prompts if share else 0))
        if parts is None:
            return self._score(model, ids, mask, lengths, P, temperature, with_entropy, share, keys, pix)
        outs = [self._score(model, ids[i], mask[i], lengths[i], P, temperature, with_entropy, share,
                            None if keys is None else keys[i], None if pix is None else [pix[j] for j in i.tolist()])
                for i in parts]
        back = torch.argsort(torch.cat(parts))           # each row back in its place
        if not with_entropy:
            return torch.cat(outs)[back]
        return torch.cat([o[0] for o in outs])[back], torch.cat([o[1] for o in outs])[back]

    def _score(self, model, ids, mask, lengths, P: int, temperature: float, with_entropy: bool, share: bool,
               keys=None, pixels=None):
        """One forward of these rows, over as many completion columns as the longest completion among them
        (padding costs compute), padded back to the batch's ``C`` columns."""
        C = ids.shape[1] - P
        c = max(1, int(lengths.max()))
        ids, mask = ids[:, :P + c], mask[:, :P + c]
        pad = (0, C - c)
        if self.chunk:                   # the output head in chunks of positions, never the whole logits
            return self._score_chunked(model, ids, mask, P, c, pad, temperature, with_entropy, share, keys, pixels)
        with self.amp():
            # one forward of each distinct prompt of a group (nodes.models.prefix); the output head only where a
            # completion token is predicted (positions P-1 .. P+c-2), not over the prompt
            logits = completion_logits(model, ids, mask, positions(model, ids, mask, pixels), P, share=share,
                                       keys=keys, pixels=pixels, features=self._features(model))
        lp = torch.nn.functional.pad(token_logprobs(logits, ids[:, P:], temperature, self.suppress), pad)
        if not with_entropy:
            return lp
        return lp, torch.nn.functional.pad(entropy(logits.detach(), temperature, self.suppress), pad)

    def _features(self, model):
        """The kept tower output (:mod:`nodes.models.picture_cache`) for the policy's own model (not the reference)."""
        return self.features if model is self.model else None

    def _score_chunked(self, model, ids, mask, P, c, pad, temperature, with_entropy, share, keys, pixels):
        """:meth:`_score` with the output head applied in chunks (:mod:`nodes.models.chunked`)."""
        with self.amp(), hidden_states_out(model) as head:
            hidden = completion_logits(model, ids, mask, positions(model, ids, mask, pixels), P, share=share,
                                       keys=keys, pixels=pixels, features=self._features(model))
            b, H = hidden.shape[0], hidden.shape[-1]
            lp, ent = head_logprobs(hidden.reshape(-1, H), head.weight, head.bias, ids[:, P:].reshape(-1),
                                    temperature, self.suppress, self.chunk)
        lp = torch.nn.functional.pad(lp.view(b, c), pad)
        return (lp, torch.nn.functional.pad(ent.view(b, c), pad)) if with_entropy else lp
