"""Static decoding for backend ``hf`` on CUDA: a static KV cache and one compiled decode step, compiled once.

``generate``'s own loop spends milliseconds of Python per token (masks, bookkeeping, many small kernels), more
than the GPU's work for a small model. So with ``decode: static`` (``auto`` on CUDA) the backend runs its own
loop: the prompts' forward (the prefill) eagerly, then every token through one ``torch.compile``d step of the
model over a :class:`transformers.StaticCache` (mode ``reduce-overhead``: a CUDA graph replayed per token); the
sampling (temperature, top-p) and the sampled token's logprob are computed from that step's logits by the
same :func:`nodes.trainer.losses.token_logprobs` as the eager path, before the next step overwrites them.

The compiled step's shapes are the batch size and the cache length, and every new pair compiles again
(30-52 s on an H200 for Qwen2.5-0.5B's shape). So shapes are bucketed:

- the batch has one size ``B`` (a firing's prompts per rank x samples per prompt): a smaller one is padded
  with dummy rows (copies of its first row, finished before their first token, dropped from the result), a
  larger one (held-out prompts) decodes in pieces of ``B``;
- the cache holds ``bucket(P) + max_new_tokens`` positions, ``P`` the batch's longest prompt rounded up to a
  power of two (at least 32), and it only grows: a shorter prompt reuses the longer cache (the same shapes: no
  compile), so a run compiles once per bucket it reaches;
- the first compile happens when the node is built (:meth:`StaticDecoder.warm_up`), in the start-up.

Prompts are left-padded to the batch's longest prompt, as on the eager path; the prefill is not compiled, so
its shape may change from batch to batch for free.

Grouped-query attention (several query heads per key/value head, as in Qwen2 and Llama): with a padding mask,
transformers' ``sdpa`` attention copies each key/value head once per query head before attending, over the
whole static cache, at every token. In an H100 profile of Qwen2.5-0.5B's shape (128 rows) that copy and the
attention over the copies took about 2 of the step's 3.4 ms. So the decoder gives the model
:func:`gqa_attention`: for one new token per row, the query heads that share a key/value head go in as that
many query rows of one attention over the cache as it is; the same result, the cache read once. The ``hf``
rollout gives it to its model on the CPU too, where ``generate``'s decode steps gained about 8% with it
(SmolLM2-135M, bf16: a probe, not a record).

>>> bucket(5), bucket(32), bucket(33), bucket(100)
(32, 32, 64, 128)
>>> pad_rows([[7, 8], [9]], 4)
([[7, 8], [9], [7, 8], [7, 8]], 2)
>>> chunks(10, 4)
[(0, 4), (4, 8), (8, 10)]
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from omnigraph.sdk.adapters import transformers as transformers_adapter

from nodes.models.tokens import token_logprobs

LEAST = 32           # the smallest prompt bucket
CHECK_EVERY = 8      # decode steps between checks that every row has stopped (each check waits for the GPU)


def bucket(n: int, least: int = LEAST) -> int:
    """The smallest power of two (times ``least``) that holds ``n`` prompt tokens."""
    b = least
    while b < n:
        b *= 2
    return b


def pad_rows(rows: list, size: int) -> tuple[list, int]:
    """``rows`` padded to ``size`` with copies of the first, and how many are real."""
    if not rows or len(rows) > size:
        raise ValueError(f"pad_rows needs 1 to {size} rows, got {len(rows)}")
    return list(rows) + [rows[0]] * (size - len(rows)), len(rows)


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """``[start, end)`` pieces of ``n`` rows, ``size`` each (the last one shorter)."""
    return [(a, min(a + size, n)) for a in range(0, n, size)]


GQA = "omnigraph_gqa"
"""The attention implementation :class:`StaticDecoder` gives a model that uses ``sdpa``."""


def gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' ``sdpa`` attention, except for one query token per row with grouped key/value heads: the
    ``g`` query heads of each key/value head attend as ``g`` query rows (``[B, KV, g, D]``) over the keys and
    values as they are, not copied ``g`` times. Query head ``h`` belongs to key/value head ``h // g``, as in
    ``repeat_kv``; the padding mask ``[B, 1, 1, L]`` is the same for all of them."""
    B, H, q, D = query.shape
    kv = key.shape[1]
    if q != 1 or kv == H or dropout or kwargs.get("position_bias") is not None:
        sdpa = transformers_adapter.sdpa_attention_forward()
        return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    mask = attention_mask
    if mask is not None and mask.ndim == 4:
        mask = mask[:, :, :, :key.shape[-2]]
    out = torch.nn.functional.scaled_dot_product_attention(query.reshape(B, kv, H // kv, D), key, value,
                                                           attn_mask=mask, scale=scaling)
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


def use_gqa(model) -> bool:
    """Give ``model`` :func:`gqa_attention` where it uses ``sdpa`` with grouped key/value heads (registered with
    transformers under :data:`GQA`, with sdpa's masks); True when it did."""
    cfg = getattr(model, "config", None)
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    attn = transformers_adapter.attn_implementation(cfg)
    if attn == GQA:
        return True
    if attn != "sdpa" or not heads or not kv or heads == kv:
        return False
    transformers_adapter.register_attention(GQA, gqa_attention)
    model.set_attn_implementation(GQA)
    return True


def _step(model, cache, ids, pos, mask):
    """One token for every row: the logits of ``ids`` ``[B, 1]`` at positions ``pos``; the cache takes its keys."""
    return model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                 use_cache=True).logits[:, -1].float()


def pick(logits: torch.Tensor, greedy: bool, temperature: float, top_p: float) -> torch.Tensor:
    """The next token of each row: argmax, or a sample of ``softmax(logits / temperature)`` within ``top_p``
    (what ``generate`` does with ``do_sample``, ``temperature``, ``top_p``, ``top_k=0``)."""
    if greedy:
        return logits.argmax(-1)
    scores = logits / max(temperature, 1e-6) if temperature != 1.0 else logits
    if top_p < 1.0:
        from transformers import TopPLogitsWarper
        scores = TopPLogitsWarper(top_p)(None, scores)
    probs = torch.softmax(scores, -1)
    # torch.multinomial(probs, 1)'s own fast path (the same draw from the same generator state), without its
    # check of the probabilities, which waits for the GPU at every token
    return (probs / torch.empty_like(probs).exponential_(1)).argmax(-1)


class StaticDecoder:
    """Decodes batches of ``batch`` rows through one compiled step (``compiled=False``: the same loop eagerly,
    which tests compare with ``generate`` on the CPU)."""

    def __init__(self, model, batch: int, max_new_tokens: int, pad_id: int, *, compiled: bool = True):
        self.model, self.B, self.C, self.pad = model, batch, max_new_tokens, pad_id
        self.device = next(model.parameters()).device
        use_gqa(model)                                  # decode steps read the key/value heads once
        self.step = torch.compile(_step, mode="reduce-overhead", dynamic=False) if compiled else _step
        self.cache, self.L = None, 0
        self.compiles: list[tuple[int, float]] = []      # (cache length, seconds) of each compile

    def _cache_for(self, P: int, C: int) -> bool:
        """Reset the cache, or grow it when ``P`` prompt and ``C`` new tokens do not fit (True: a compile follows)."""
        L = bucket(P) + max(self.C, C)
        if self.cache is not None and L <= self.L:
            self.cache.reset()
            return False
        from transformers import StaticCache
        self.cache, self.L = StaticCache(config=self.model.config, max_cache_len=L), L
        return True

    def warm_up(self, prompt_len: int) -> float:
        """Compile the step for the cache that ``prompt_len`` prompt tokens need (three steps: compile, record the
        CUDA graph, replay it); seconds it took."""
        t0 = time.perf_counter()
        self.decode([[self.pad] * prompt_len] * self.B, max_new_tokens=4, greedy=True, temperature=1.0,
                    top_p=1.0, stops=[])
        torch.cuda.synchronize(self.device) if self.device.type == "cuda" else None
        return time.perf_counter() - t0

    @torch.no_grad()
    def decode(self, rows: list[list[int]], *, max_new_tokens: int, greedy: bool, temperature: float,
               top_p: float, stops: list[int], fault: Callable[[], None] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, logprobs)`` ``[len(rows), c]`` on the device (``c <= max_new_tokens``): each row's new
        tokens (``pad_id`` after its stop token) and their logprobs under ``softmax(logits / temperature)``."""
        parts = [self._decode(rows[a:b], max_new_tokens, greedy, temperature, top_p, stops, fault)
                 for a, b in chunks(len(rows), self.B)]
        c = max(t.shape[1] for t, _ in parts)
        pad = torch.nn.functional.pad
        return (torch.cat([pad(t, (0, c - t.shape[1]), value=self.pad) for t, _ in parts]),
                torch.cat([pad(lp, (0, c - lp.shape[1])) for _, lp in parts]))

    def _decode(self, rows, C, greedy, temperature, top_p, stops, fault):
        rows, n = pad_rows(rows, self.B)
        B, dev = self.B, self.device
        P = max(len(r) for r in rows)
        t0, grew = time.perf_counter(), self._cache_for(P, C)
        lens = torch.tensor([len(r) for r in rows], device=dev)
        ids = torch.tensor([[self.pad] * (P - len(r)) + list(r) for r in rows], device=dev)
        mask = (torch.arange(self.L, device=dev)[None, :] >= (P - lens)[:, None]).long()   # pads 0, the rest 1
        pos = (mask[:, :P].cumsum(1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self.cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1].float()
        pos = pos[:, -1:] + 1
        done = torch.arange(B, device=dev) >= n                      # dummy rows: finished from the start
        stop = torch.tensor(stops, device=dev, dtype=torch.long)
        toks = torch.full((B, C), self.pad, dtype=torch.long, device=dev)
        lps = torch.zeros((B, C), device=dev)
        temp = max(temperature, 1e-6)
        c = C
        for t in range(C):
            if fault is not None:
                fault()
            tok = torch.where(done, self.pad, pick(logits, greedy, temperature, top_p))
            toks[:, t] = tok
            lps[:, t] = token_logprobs(logits[:, None], tok[:, None], temp)[:, 0]
            done = done | torch.isin(tok, stop)
            if t + 1 == C or ((t + 1) % CHECK_EVERY == 0 and bool(done.all())):
                c = t + 1
                break
            if self.step is not _step:
                torch.compiler.cudagraph_mark_step_begin()     # the last step's logits are consumed
            logits = self.step(self.model, self.cache, tok[:, None], pos, mask)
            pos = pos + 1
            if grew and t == 0:                                # the first compiled step compiles
                self.compiles.append((self.L, time.perf_counter() - t0))
        return toks[:n, :c], lps[:n, :c]
