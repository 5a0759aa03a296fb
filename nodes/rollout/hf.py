"""``generate`` with backend ``hf``: batched sampling with transformers, per-token logprobs, versions.

Each rollout rank samples ``samples_per_prompt`` completions of the prompts the
engine gives it (the fields are documented in :mod:`nodes.rollout.base`). New weights
(from ``sync``) are loaded when their version changes: full state dicts, or
LoRA adapter tensors; over NCCL they arrive straight in the model's tensors
(:meth:`Generate.weight_targets`); any other way, they are copied into the model's parameters in place, in one
multi-tensor copy (:func:`omnigraph.sdk.copy_into`).

On CUDA (``decode: auto`` or ``static``) :meth:`Generate.sample` decodes through a static KV cache and a
compiled decode step, compiled once when the node is built (:mod:`nodes.rollout.decode`); on the CPU (or ``decode:
eager``) through transformers' ``generate``. Partial rollouts (:meth:`Generate.continue_rows`) always decode
eagerly: their rows and budgets change every firing. Either way the prompts shared by a group's samples are
prefilled once (:func:`nodes.models.prefix.prefill`), and a model with grouped key/value heads attends in its decode
steps without copying them (:func:`nodes.rollout.decode.use_gqa`).

The token loop is a fault point (``ctx.fault("token")``, once per generated
token): tests inject failures in the middle of generation there.
"""

from __future__ import annotations

import time

import torch
from transformers import StoppingCriteria

from omnigraph.sdk import ConfigError, NodeContext, Weights, copy_into

from nodes import models
from nodes.rollout import HfOptions
from nodes.rollout.decode import StaticDecoder, bucket, use_gqa
from nodes.models.tokens import token_logprobs
from nodes.models.prefix import generate_pictures, prefill
from nodes.models.vision import EncoderClock, image_key, placeholder_ids, processor
from nodes.rollout.base import Rollout


class _FaultPoint(StoppingCriteria):
    """Called by ``generate`` after every new token: the ``token`` fault point; never stops generation."""

    def __init__(self, ctx: NodeContext):
        self.ctx, self.first = ctx, None        # first: when the first new token was sampled (the prefill's end)

    def __call__(self, input_ids, scores, **kwargs):
        self.first = self.first or time.perf_counter()
        self.ctx.fault("token")
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class _Budget(StoppingCriteria):
    """Partial rollouts: row ``i`` stops after ``budgets[i]`` new tokens, or when ``deadline`` passes unless
    ``final[i]``; ``taken[i]`` is how many tokens it had then. Also the ``token`` fault point."""

    def __init__(self, ctx: NodeContext, prompt_len: int, budgets: list[int], deadline: float | None,
                 final: list[bool]):
        self.ctx, self.P, self.deadline = ctx, prompt_len, deadline
        self.budgets = torch.tensor(budgets)
        self.final = torch.tensor(final, dtype=torch.bool)
        self.taken = list(budgets)
        self.stopped = torch.zeros(len(budgets), dtype=torch.bool)

    def __call__(self, input_ids, scores, **kwargs):
        self.ctx.fault("token")
        j = input_ids.shape[1] - self.P
        now = (self.budgets <= j)
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            now |= ~self.final
        for i in torch.nonzero(now & ~self.stopped).flatten().tolist():
            self.taken[i] = j
        self.stopped |= now
        return self.stopped.to(input_ids.device)


class Generate(Rollout):
    def __init__(self, ctx: NodeContext):
        super().__init__(ctx)
        self.device = ctx.device          # cuda for a pool with gpus > 0; outputs are host tensors
        self.model, self.tok = models.load(ctx.model.dir, self.options.dtype or ctx.model.dtype, self.device)
        self.model.eval()
        use_gqa(self.model)                        # decode steps read the key/value heads once (nodes.rollout.decode)
        self.lora = ctx.policy.lora
        if self.lora is not None:
            self.model = models.with_lora(self.model, self.lora)
        else:
            models.contiguous(self.model)       # new weights arrive in one copy (copy_into coalesces)
        self.processor = processor(ctx.model.dir)       # an image-text model's (None for a text model)
        self.encoder = EncoderClock(self.model) if self.processor is not None else None
        # an image-text model never samples its image placeholders (nodes.models.tokens); None: nothing suppressed
        self.suppress = (placeholder_ids(self.model) or None) if self.processor is not None else None
        self.stops = self.stop_ids()
        self.stopper = _FaultPoint(ctx)
        self._targets: dict = {}                   # payload -> the model's own tensors (stable: written in place)
        self._plans: dict = {}                     # copy_into's matched lists
        self.decoder = self._static_decoder()

    def _static_decoder(self) -> StaticDecoder | None:
        """``decode: static`` (``auto`` on CUDA): the compiled decode step, compiled here, in the start-up."""
        ctx = self.ctx
        opt = (ctx.backend_options or HfOptions()).decode
        mode = opt.mode
        if mode == "eager" or (mode == "auto" and torch.device(self.device).type != "cuda"):
            return None
        if torch.device(self.device).type != "cuda":
            raise ConfigError(f"decode: static compiles the decode step for CUDA; this rollout runs on {self.device}",
                              where=f"nodes.{ctx.name}.options.decode",
                              fix="use decode: auto or eager, or give the pool gpus")
        B = -(-ctx.run.prompts // ctx.world) * ctx.run.samples_per_prompt
        dec = StaticDecoder(self.model, B, self.options.max_new_tokens, self.tok.pad_token_id)
        P = bucket(opt.prompt_len)
        print(f"{ctx.name}: compiling the decode step for B={B}, prompts up to {P} tokens + "
              f"{self.options.max_new_tokens} new ...", flush=True)
        s = dec.warm_up(P)
        print(f"{ctx.name}: decode step compiled in {s:.1f} s", flush=True)
        ctx.log(decode_compile_s=s)
        return dec

    # -- weights -------------------------------------------------------------
    def load_weights(self, weights: Weights) -> None:
        if weights.loaded:                                  # written into the model by the transport on arrival
            if not self.finite_weights(weights, self.weight_targets(weights.payload)):
                raise ValueError(f"weights version {weights.version} arrived with non-finite values, written by "
                                 f"the transport ({weights.path}) into the model's own tensors: the weights it "
                                 "held are gone (runtime.max_restarts restarts from the last checkpoint)")
            self.version = weights.version
            if weights.arrive_s:
                self.ctx.log(load_weights_s=weights.arrive_s)      # the copy, done then (cuda-ipc)
            return
        if weights.tensors is None:
            raise ValueError(f"weights of version {weights.version} arrived without tensors: the hf backend "
                             "needs a trainer that exports weights (sync backend torch)")
        if not self.finite_weights(weights):               # a NaN or inf: keep the weights held
            return
        t0 = time.perf_counter()
        if weights.payload == "lora":
            from peft import set_peft_model_state_dict
            set_peft_model_state_dict(self.model, dict(weights.tensors))      # peft wants a dict
        else:
            copy_into(self.weight_targets("full"), weights.tensors, self._plans)   # in place: the CUDA graphs keep them
        if self.device != "cpu":
            torch.cuda.synchronize()
        self.version = weights.version
        self.ctx.log(load_weights_s=time.perf_counter() - t0)

    def weight_targets(self, payload: str):
        """The model's own tensors: a transport that receives bucket by bucket (NCCL) or from a CUDA IPC buffer
        writes into them. Built once per payload (the same mapping every time: transports keep plans for it)."""
        if payload not in self._targets:
            if payload == "lora":
                from peft import get_peft_model_state_dict
                self._targets[payload] = get_peft_model_state_dict(self.model)
            else:
                self._targets[payload] = self.model.state_dict()
        return self._targets[payload]

    def state_dict(self) -> dict:
        return {"version": self.version, "model": self.model.state_dict(), **self.carry_state()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.version = state["version"]
        self.load_carry(state)

    # -- sampling ------------------------------------------------------------
    @torch.no_grad()
    def continue_rows(self, rows: list[list[int]], budgets: list[int], *, seed: int, deadline: float | None = None,
                      final: list[bool] | None = None, pixels: list | None = None) -> list[tuple[list[int], list[float], bool]]:
        """Partial rollouts (:mod:`nodes.rollout.partial`): sample at most ``budgets[i]`` more tokens after each row
        (a prompt and the tokens sampled so far), all rows in one batch; ``(tokens, logprobs, stopped)`` each.
        Always eager ``generate`` (a per-row budget and a deadline stop rows mid-batch), also on CUDA. ``pixels``:
        each row's prompt's pixel values (prompts with pictures), read again in every firing."""
        tok, s = self.tok, self.options
        P = max(len(r) for r in rows)
        ids = torch.tensor([[tok.pad_token_id] * (P - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows])
        budget = _Budget(self.ctx, P, budgets, deadline, final or [False] * len(rows))
        torch.manual_seed(seed)
        ids, mask = ids.to(self.device), mask.to(self.device)
        keys = None if pixels is None else torch.tensor([image_key(p) for p in pixels], device=self.device)
        cache = prefill(self.model, ids, mask, keys, pixels, self.suppress)
        seen = generate_pictures(self.model, ids, pixels, cache)
        out = self.model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, **seen,
                                  do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0,
                                  max_new_tokens=max(budgets), eos_token_id=self.stops, pad_token_id=tok.pad_token_id,
                                  output_logits=True, return_dict_in_generate=True, stopping_criteria=[budget],
                                  suppress_tokens=self.suppress)
        comp = out.sequences[:, P:]
        lp = token_logprobs(torch.stack(out.logits, dim=1), comp, max(s.temperature, 1e-6), self.suppress).cpu()
        comp = comp.cpu().tolist()
        stops = set(self.stops)
        res = []
        for i, row in enumerate(comp):
            n = min(budget.taken[i], len(row))
            end = next((j + 1 for j, t in enumerate(row[:n]) if t in stops), None)
            n = end or n
            res.append((row[:n], lp[i, :n].tolist(), end is not None))
        return res

    @torch.no_grad()
    def sample(self, prompts: list[list[int]], n: int, *, greedy: bool, seed: int,
               max_new_tokens: int | None = None, pixels: list | None = None) -> dict:
        """``n`` completions of each prompt; ``pixels``: each prompt's pixel values (``None`` for one without
        pictures), which the model's vision tower reads once per distinct prompt, in the prefill."""
        tok, s = self.tok, self.options
        C = max_new_tokens or s.max_new_tokens
        P = max(len(p) for p in prompts)
        ids = torch.tensor([[tok.pad_token_id] * (P - len(p)) + p for p in prompts]).repeat_interleave(n, 0)
        mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts]).repeat_interleave(n, 0)
        torch.manual_seed(seed)
        temp = max(s.temperature, 1e-6)
        if self.encoder is not None:
            self.encoder.take()
        rows = None if pixels is None else [pixels[i // n] for i in range(len(prompts) * n)]
        keys = None if rows is None else torch.tensor([image_key(p) for p in rows], device=self.device)
        if self.decoder is not None and rows is None:                 # static cache, compiled step
            comp, lp = self.decoder.decode([p for p in prompts for _ in range(n)], max_new_tokens=C, greedy=greedy,
                                           temperature=s.temperature, top_p=s.top_p, stops=self.stops,
                                           fault=lambda: self.ctx.fault("token"))
        else:
            on_ids, on_mask = ids.to(self.device), mask.to(self.device)
            t0, self.stopper.first = time.perf_counter(), None
            # the prompts' keys and values once per prompt, not once per sample (nodes.models.prefix)
            cache = prefill(self.model, on_ids, on_mask, keys, rows, self.suppress)
            seen = generate_pictures(self.model, on_ids, rows, cache)       # else generate reads them
            out = self.model.generate(input_ids=on_ids, attention_mask=on_mask, **seen,
                                      past_key_values=cache, do_sample=not greedy,
                                      temperature=s.temperature if not greedy else None,
                                      top_p=s.top_p if not greedy else None, top_k=0 if not greedy else None,
                                      max_new_tokens=C, eos_token_id=self.stops,
                                      pad_token_id=tok.pad_token_id, output_logits=True, return_dict_in_generate=True,
                                      stopping_criteria=[self.stopper], suppress_tokens=self.suppress)
            comp, lp = out.sequences[:, P:], None
            logits = torch.stack(out.logits, dim=1)                   # [B, c, V], c <= C
            prefill_s = (self.stopper.first or time.perf_counter()) - t0     # to the first new token
        c = comp.shape[1]
        alive = torch.ones_like(comp, dtype=torch.float32)
        stop = torch.isin(comp, torch.tensor(self.stops, device=comp.device))
        ended = (stop.cumsum(1) - stop.long()) > 0                    # tokens after the first stop
        alive[ended] = 0.0
        comp = comp.masked_fill(ended, tok.pad_token_id)
        lp = (lp if lp is not None else token_logprobs(logits, comp, temp, self.suppress)) * alive
        comp, alive, lp = comp.cpu(), alive.cpu(), lp.cpu()           # the batch travels as host tensors
        pad = C - c
        comp = torch.nn.functional.pad(comp, (0, pad), value=tok.pad_token_id)
        alive = torch.nn.functional.pad(alive, (0, pad))
        lp = torch.nn.functional.pad(lp, (0, pad))
        texts_out = [tok.decode(row[m > 0].tolist(), skip_special_tokens=True) for row, m in zip(comp, alive)]
        out = {"input_ids": torch.cat([ids, comp], 1), "attention_mask": torch.cat([mask, alive.long()], 1),
               "response_mask": alive, "logprob": lp, "completion": texts_out, "prompt_len": P}
        if self.encoder is not None:
            out["prefill_s"] = prefill_s if self.decoder is None or rows is not None else None
            out["encoder_s"], first, last = self.encoder.take()      # the vision tower's part, for the timeline
            if first is not None and not greedy:
                self.ctx.span("vision encoder", first, last)
        return out
