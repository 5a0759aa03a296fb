"""What every token generator shares (role generator): prompts in, a batch of sampled completions out.

A backend (``nodes.hf``, ``nodes.vllm_backend``) provides ``tok``,
``load_weights(weights)`` and ``sample(texts_or_ids, n, greedy=, seed=)``
returning the fields below; this base turns them into a
:class:`~omnigraph.sdk.SampleBatch` (first dimension: samples):

- ``input_ids`` ``[B, P + C]``: the prompt left-padded to the batch's longest
  prompt ``P``, then the completion right-padded to ``C = max_new_tokens``;
- ``attention_mask`` ``[B, P + C]``; ``response_mask`` ``[B, C]`` (completion
  tokens up to and including the stop token);
- ``logprob`` ``[B, C]``: log-probabilities of the sampled tokens under the
  sampling policy ``softmax(logits / temperature)``, the behaviour policy of
  the decoupled PPO loss;
- ``prompt``, ``completion``, ``target`` (texts, for the reward), ``meta`` (each
  prompt's ``meta``: the reward function gets its keys as keyword arguments).

With ``env:`` the samples are multi-turn episodes (:mod:`nodes.episodes`): the completion region holds
the model's and the environment's tokens (``env.max_tokens`` columns, ``response_mask`` on the model's
only), ``completion`` is the model's last message and ``meta["episode"]`` the episode's record (its
reward, turns, tool calls and messages), which the reward function gets as ``episode``.

``input_ids`` and ``attention_mask`` are prompt-aligned (``meta["prompt_aligned"]``):
shards from several rollout ranks join with their prompts left-padded alike.
"""

from __future__ import annotations

import time
import zlib

from omnigraph.sdk import NodeContext, Prompt, SampleBatch, Weights

from nodes.episodes import Episodes
from nodes.prompting import encode


def step_seed(seed: int, step: int, rank: int, salt: str = "gen") -> int:
    return zlib.crc32(f"{salt}:{seed}:{step}:{rank}".encode())


class Rollout:
    def __init__(self, ctx: NodeContext):
        self.ctx, self.options = ctx, ctx.options
        self.version = 0
        self._episodes = None

    @property
    def episodes(self):
        """The multi-turn loop (``env:`` set), built on first use: after the backend has its tokenizer."""
        if self._episodes is None and getattr(self.options, "env", None) is not None:
            self._episodes = Episodes(self)
        return self._episodes

    def _sample(self, prompts: list[Prompt], n: int, *, greedy: bool, seed: int) -> tuple[dict, list[dict]]:
        """Completions (single-turn) or episodes (``env:``), and each sample's meta."""
        if self.episodes is None:
            out = self.sample([self.encode(p) for p in prompts], n, greedy=greedy, seed=seed)
            return out, [prompts[i // n].meta for i in range(len(out["completion"]))]
        out, eps = self.episodes.run(prompts, n, greedy=greedy, seed=seed)
        if not greedy:
            self.ctx.log(**self.episodes.stats)
            for span in self.episodes.spans:
                self.ctx.span(*span)
        return out, [{**e.prompt.meta, "episode": e.record()} for e in eps]

    def generate(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        ctx = self.ctx
        k = ctx.run.samples_per_prompt
        t0 = time.perf_counter()
        out, metas = self._sample(prompts, k, greedy=False, seed=step_seed(ctx.seed, step, ctx.rank))
        dt = time.perf_counter() - t0
        n = len(out["completion"])
        fields = {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"],
                  "response_mask": out["response_mask"], "logprob": out["logprob"],
                  "prompt": [prompts[i // k].text for i in range(n)], "completion": out["completion"],
                  "target": [prompts[i // k].meta.get("target", "") for i in range(n)], "meta": metas}
        meta = {"prompt_len": out["prompt_len"], "temperature": self.options.temperature,
                "prompt_aligned": {"input_ids": self.tok.pad_token_id, "attention_mask": 0}}
        batch = SampleBatch(step, [prompts[i // k].group for i in range(n)], [weights.version] * n,
                            [weights.version] * n, fields, meta)
        ctx.log(response_len=float(out["response_mask"].sum(1).mean()),
                gen_tokens_per_s=float(out["response_mask"].sum()) / max(dt, 1e-9))
        return batch

    def evaluate(self, prompts: list[Prompt]) -> dict:
        """Greedy completions of the held-out prompts, scored later by the reward node."""
        out, metas = self._sample(prompts, 1, greedy=True, seed=0)
        return {"prompt": [p.text for p in prompts], "completion": out["completion"],
                "target": [p.meta.get("target", "") for p in prompts], "meta": metas, "version": self.version}

    def encode(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, the same on every backend (:func:`nodes.prompting.encode`)."""
        return encode(self.tok, prompt, self.ctx.model.name)

    def stop_ids(self) -> list[int]:
        """The end-of-sequence token and the option ``stop`` strings (single tokens)."""
        tok = self.tok
        return [tok.eos_token_id] + [tok.convert_tokens_to_ids(tok.tokenize(s))[0] for s in self.options.stop
                                     if tok.tokenize(s)]
