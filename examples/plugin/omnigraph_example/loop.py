"""The ``loop`` generate backend: sampling as a plain token loop over the model's KV cache.

It fills the generator role of ``omnigraph.sdk`` with its own sampler: one
forward pass per token over the cache, ``softmax(logits / temperature)``
sampled with a seeded generator, the sampled token's logprob kept (the
behaviour policy of the decoupled PPO loss), stop at the end-of-sequence
token. Its batch has the fields omnigraph's trainer reads.
"""

from __future__ import annotations

import zlib

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from omnigraph.sdk import NodeContext, Prompt, SampleBatch, Weights


class LoopGenerate:
    def __init__(self, ctx: NodeContext):
        self.ctx, self.options = ctx, ctx.options
        self.tok = AutoTokenizer.from_pretrained(ctx.model.dir)
        self.model = AutoModelForCausalLM.from_pretrained(ctx.model.dir, dtype=getattr(torch, ctx.model.dtype)).eval()
        self.version = 0

    def load_weights(self, weights: Weights) -> None:
        if weights.tensors is None:
            raise ValueError(f"weights of version {weights.version} arrived without tensors")
        self.model.load_state_dict(weights.tensors, strict=True)
        self.version = weights.version

    def generate(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        k = self.ctx.run.samples_per_prompt
        seed = zlib.crc32(f"loop:{self.ctx.seed}:{step}:{self.ctx.rank}".encode())
        out = self.sample([p.text for p in prompts], k, greedy=False, seed=seed)
        n = len(out["completion"])
        fields = {key: out[key] for key in ("input_ids", "attention_mask", "response_mask", "logprob", "completion")}
        fields |= {"prompt": [prompts[i // k].text for i in range(n)],
                   "target": [prompts[i // k].meta.get("target", "") for i in range(n)]}
        meta = {"prompt_len": out["prompt_len"], "temperature": self.options.temperature,
                "prompt_aligned": {"input_ids": self.tok.pad_token_id, "attention_mask": 0}}
        return SampleBatch(step, [prompts[i // k].group for i in range(n)], [weights.version] * n,
                           [weights.version] * n, fields, meta)

    def evaluate(self, prompts: list[Prompt]) -> dict:
        out = self.sample([p.text for p in prompts], 1, greedy=True, seed=0)
        return {"prompt": [p.text for p in prompts], "completion": out["completion"],
                "target": [p.meta.get("target", "") for p in prompts], "version": self.version}

    @torch.no_grad()
    def sample(self, texts: list[str], n: int, *, greedy: bool, seed: int) -> dict:
        tok, C = self.tok, self.options.max_new_tokens
        T = max(self.options.temperature, 1e-6)
        ids = [[tok.bos_token_id] + tok(t, add_special_tokens=False).input_ids for t in texts]
        P = max(map(len, ids))
        prompt = torch.tensor([[tok.pad_token_id] * (P - len(x)) + x for x in ids]).repeat_interleave(n, 0)
        mask = torch.tensor([[0] * (P - len(x)) + [1] * len(x) for x in ids]).repeat_interleave(n, 0)
        B = prompt.shape[0]
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.full((B, C), tok.pad_token_id, dtype=torch.long)
        logps = torch.zeros(B, C)
        alive = torch.zeros(B, C)
        running = torch.ones(B, dtype=torch.bool)
        step_ids, step_mask, cache = prompt, mask, None
        for t in range(C):
            self.ctx.fault("token")
            pos = (step_mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
            out = self.model(input_ids=step_ids, attention_mask=step_mask, position_ids=pos, past_key_values=cache,
                             use_cache=True)
            cache = out.past_key_values
            logp = torch.log_softmax(out.logits[:, -1].float() / T, dim=-1)
            nxt = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
            nxt = torch.where(running, nxt, torch.full_like(nxt, tok.pad_token_id))
            tokens[:, t] = nxt
            alive[:, t] = running.float()
            logps[:, t] = torch.where(running, logp.gather(1, nxt[:, None]).squeeze(1), torch.zeros(B))
            running &= nxt != tok.eos_token_id
            if not running.any():
                break
            step_ids = nxt[:, None]
            step_mask = torch.cat([step_mask, torch.ones(B, 1, dtype=step_mask.dtype)], 1)
        if greedy:
            logps.zero_()
        texts_out = [tok.decode(r[m > 0].tolist(), skip_special_tokens=True) for r, m in zip(tokens, alive)]
        return {"input_ids": torch.cat([prompt, tokens], 1), "attention_mask": torch.cat([mask, alive.long()], 1),
                "response_mask": alive, "logprob": logps, "completion": texts_out, "prompt_len": P}
