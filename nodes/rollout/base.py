"""What every token generator shares (role generator): prompts in, a batch of sampled completions out.

A backend (``nodes.rollout.hf``, ``nodes.rollout.vllm_engine``) provides ``tok``,
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

With ``env:`` the samples are multi-turn episodes (:mod:`nodes.rollout.episodes`): the completion region holds
the model's and the environment's tokens (``env.max_tokens`` columns, ``response_mask`` on the model's
only), ``completion`` is the model's last message and ``meta["episode"]`` the episode's record (its
reward, turns, tool calls and messages), which the reward function gets as ``episode``.

Prompts with pictures (``Prompt.images``, an image-text model: :mod:`nodes.models.vision`) add ``pixel_values``
(each sample's, a list: the trainer runs the same pixels) and ``image_key`` ``[B]`` (samples share a prompt only
where their pictures are the same too).

Every batch also has ``token_version`` ``[B, C]`` (the weights version that sampled each completion token,
``-1`` where there is none) and ``spans`` (firings each sample took). With ``partial:`` (:mod:`nodes.rollout.partial`)
a batch holds the prompt groups that finished in this firing, some begun in earlier ones: their older tokens
keep the version and logprob they were sampled with (the decoupled PPO loss reads those per token), and a
sample's ``min_version`` is its oldest token.

``input_ids`` and ``attention_mask`` are prompt-aligned (``meta["prompt_aligned"]``):
shards from several rollout ranks join with their prompts left-padded alike.

Weights received at a sync pass :meth:`Rollout.finite_weights` before a backend loads them (:mod:`nodes.nonfinite`):
with a NaN or inf in them they are not loaded, and the rollout goes on sampling with the weights it holds
(its samples still carry the version that arrived: the decoupled loss reads their own log-probs, so only the
reported staleness is one version short). Weights a transport already wrote into the model's own tensors
cannot be refused that way: the node fails instead (a supervised run restarts from its last checkpoint).
"""

from __future__ import annotations

import time
import zlib

import torch

from omnigraph.sdk import NodeContext, Prompt, SampleBatch, Weights

from nodes.nonfinite import Streak, count_tensor, finite_tensors, poison, warn
from nodes.rollout.episodes import Episodes
from nodes.rollout.partial import Carry, Group
from nodes.models.vision import image_key
from nodes.tasks.prompting import encode, encode_pictures


def step_seed(seed: int, step: int, rank: int, salt: str = "gen") -> int:
    return zlib.crc32(f"{salt}:{seed}:{step}:{rank}".encode())


class Rollout:
    def __init__(self, ctx: NodeContext):
        self.ctx, self.options = ctx, ctx.options
        self.version = 0
        self._episodes = None
        self._agents = None
        p = getattr(self.options, "partial", None)
        self.carry = None if p is None else Carry(p, self.options.max_new_tokens, ctx.run.iterations)
        self.nonfinite = Streak("nonfinite_weights")

    def finite_weights(self, weights: Weights, tensors=None) -> bool:
        """Whether the weights received at a sync (``tensors``: where they are now, ``weights.tensors``
        unless a transport wrote them into the model's own) are all finite; if not, the sync is warned about
        and counted (``nonfinite_weights_skipped``, ``nonfinite_weights_in_a_row``) and the caller does not
        use them. Cost: one read of every received tensor on the device it arrived on (``torch.isfinite(t).all()``
        each, one host sync per device), about half of what copying them in costs; only where weights
        arrive, once per sync. The fault point ``weights`` (``generate@5/weights:corrupt``) makes one value
        NaN, in a copy: the sender's tensors stay intact."""
        tensors = weights.tensors if tensors is None else tensors
        if self.ctx.fault("weights"):
            tensors = dict(tensors)
            name = next((k for k, t in tensors.items() if t.is_floating_point() and t.numel()), None)
            if name is not None:
                tensors[name] = poison(tensors[name])
        ok = finite_tensors(tensors.values())
        if not ok:
            found = {k: n for k, t in tensors.items() if (n := count_tensor(t))}
            names = dict(list(found.items())[:3])
            warn(self.ctx.name, f"weights version {weights.version}", names,
                 f"not loaded ({len(found)} of {len(tensors)} tensors): the rollout keeps version {self.version}")
        self.ctx.log(**self.nonfinite.record(not ok))
        return ok

    @property
    def episodes(self):
        """The multi-turn loop (``env:`` set), built on first use: after the backend has its tokenizer."""
        if self._episodes is None and getattr(self.options, "env", None) is not None:
            self._episodes = Episodes(self)
        return self._episodes

    @property
    def agents(self):
        """The agent rollout (``agent:`` set; :mod:`nodes.rollout.agents`), its endpoint started on first use."""
        if self._agents is None and getattr(self.options, "agent", None) is not None:
            from nodes.rollout.agents import Agents        # FastAPI, uvicorn and openai only where agents run
            self._agents = Agents(self)
        return self._agents

    def _sample(self, prompts: list[Prompt], n: int, *, greedy: bool,
                seed: int) -> tuple[dict, list[dict], list[int]]:
        """Completions (single-turn), episodes (``env:``) or agent runs (``agent:``): the samples, each one's
        meta, and each one's prompt (an index of ``prompts``; ``n`` samples each, or more where an agent's
        episode was split)."""
        if self.agents is not None:
            out, eps = self.agents.run(prompts, n, greedy=greedy, seed=seed)
            self.agents.report()
            if not greedy:
                self.ctx.log(**self.agents.stats)
            return out, [{**e.prompt.meta, "episode": e.record()} for e in eps], [e.index // n for e in eps]
        owners = [i // n for i in range(len(prompts) * n)]
        if self.episodes is None:
            ids, pixels = self.encode_all(prompts)
            if pixels is None:
                return self.sample(ids, n, greedy=greedy, seed=seed), [prompts[i].meta for i in owners], owners
            out = self.sample(ids, n, greedy=greedy, seed=seed, pixels=pixels)
            keys = [image_key(p) for p in pixels]
            out["pixel_values"] = [pixels[i] for i in owners]            # each sample's pictures, for the trainer
            out["image_key"] = torch.tensor([keys[i] for i in owners], dtype=torch.long)
            return out, [prompts[i].meta for i in owners], owners
        out, eps = self.episodes.run(prompts, n, greedy=greedy, seed=seed)
        if not greedy:
            self.ctx.log(**self.episodes.stats)
            for span in self.episodes.spans:
                self.ctx.span(*span)
        return out, [{**e.prompt.meta, "episode": e.record()} for e in eps], owners

    def generate(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        if self.agents is not None and self.agents.spans is not None:
            return self._generate_agent_spans(step, prompts, weights)
        if self.carry is not None:
            return self._generate_partial(step, prompts, weights)
        ctx = self.ctx
        k = ctx.run.samples_per_prompt
        t0 = time.perf_counter()
        out, metas, of = self._sample(prompts, k, greedy=False, seed=step_seed(ctx.seed, step, ctx.rank))
        dt = time.perf_counter() - t0
        n = len(out["completion"])
        versions = torch.where(out["response_mask"] > 0, weights.version, -1).long()
        fields = {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"],
                  "response_mask": out["response_mask"], "logprob": out["logprob"], "token_version": versions,
                  "spans": [1] * n,
                  "prompt": [prompts[i].text for i in of], "completion": out["completion"],
                  "target": [prompts[i].meta.get("target", "") for i in of], "meta": metas}
        fields.update({k: out[k] for k in ("pixel_values", "image_key") if k in out})
        meta = {"prompt_len": out["prompt_len"], "temperature": self.options.temperature,
                "prompt_aligned": {"input_ids": self.tok.pad_token_id, "attention_mask": 0}}
        batch = SampleBatch(step, [prompts[i].group for i in of], [weights.version] * n,
                            [weights.version] * n, fields, meta)
        tokens = float(out["response_mask"].sum())
        ctx.log(response_len=float(out["response_mask"].sum(1).mean()), returned_tokens=tokens,
                gen_tokens_per_s=tokens / max(dt, 1e-9))
        if "encoder_s" in out:                   # an image-text model: its vision tower's share of the firing
            ctx.log(encoder_s=out["encoder_s"], encoder_share=out["encoder_s"] / max(dt, 1e-9))
            if out.get("prefill_s") is not None:     # the prompts' forward (the tower in it) to the first new token
                ctx.log(prefill_s=out["prefill_s"], prefill_share=out["prefill_s"] / max(dt, 1e-9))
        return batch

    # -- partial rollouts ------------------------------------------------------
    def _generate_partial(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        ctx = self.ctx
        t0 = time.perf_counter()
        ids, pixels = self.encode_all(prompts)
        done = self.carry.fire(step, prompts, ids, ctx.run.samples_per_prompt, weights.version, self.continue_rows,
                               step_seed(ctx.seed, step, ctx.rank), pixels)
        stats = self.carry.stats
        ctx.log(**stats)
        label = f"{stats['partial_rows'] - stats['carried_rows']:.0f} new + {stats['carried_rows']:.0f} carried rows"
        ctx.span(label, t0, time.perf_counter())
        batch = self._partial_batch(step, done)
        if len(batch):
            ctx.log(response_len=float(batch.fields["response_mask"].sum(1).mean()))
        return batch

    def _generate_agent_spans(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        """Agent episodes across firings (:mod:`nodes.rollout.agent_spans`): the groups that ended in this one."""
        ctx, agents = self.ctx, self.agents
        t0 = time.perf_counter()
        eps = agents.spans.fire(step, prompts, ctx.run.samples_per_prompt, step_seed(ctx.seed, step, ctx.rank))
        agents.report()
        ctx.log(**agents.stats)
        ctx.span(f"{agents.stats['agent_requests']} requests, {agents.stats['carried_groups_out']} groups carried",
                 t0, time.perf_counter())
        out, rows = agents._batch(eps)
        versions = out["token_version"]
        lo = [int(v[v >= 0].min()) if (v >= 0).any() else weights.version for v in versions]
        hi = [int(v[v >= 0].max()) if (v >= 0).any() else weights.version for v in versions]
        fields = {**{k: out[k] for k in ("input_ids", "attention_mask", "response_mask", "logprob", "completion")},
                  "token_version": versions, "spans": [e.spans for e in rows],
                  "prompt": [e.prompt.text for e in rows], "target": [e.prompt.meta.get("target", "") for e in rows],
                  "meta": [{**e.prompt.meta, "episode": e.record()} for e in rows]}
        fields.update({k: out[k] for k in ("pixel_values", "image_key") if k in out})
        if rows:
            ctx.log(response_len=float(out["response_mask"].sum(1).mean()))
        meta = {"prompt_len": out["prompt_len"], "temperature": self.options.temperature,
                "prompt_aligned": {"input_ids": self.tok.pad_token_id, "attention_mask": 0}}
        return SampleBatch(step, [e.prompt.group for e in rows], lo, hi, fields, meta)

    def _partial_batch(self, step: int, groups: list[Group]) -> SampleBatch:
        """The finished groups as one batch, laid out as :meth:`generate`'s (prompt left-padded, completion
        right-padded to ``max_new_tokens``)."""
        tok, C = self.tok, self.options.max_new_tokens
        samples = [(g, s) for g in groups for s in g.samples]
        B = len(samples)
        P = max((len(s.prompt) for _, s in samples), default=0)
        ids = torch.full((B, P + C), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, P + C), dtype=torch.long)
        alive, lp = torch.zeros((B, C)), torch.zeros((B, C))
        versions = torch.full((B, C), -1, dtype=torch.long)
        for i, (_, s) in enumerate(samples):
            n = len(s.tokens)
            ids[i, P - len(s.prompt):P] = torch.tensor(s.prompt, dtype=torch.long)
            mask[i, P - len(s.prompt):P + n] = 1
            if n:
                ids[i, P:P + n] = torch.tensor(s.tokens, dtype=torch.long)
                alive[i, :n] = 1.0
                lp[i, :n] = torch.tensor(s.logprobs)
                versions[i, :n] = torch.tensor(s.versions, dtype=torch.long)
        lo = [min(s.versions, default=self.version) for _, s in samples]
        hi = [max(s.versions, default=self.version) for _, s in samples]
        fields = {"input_ids": ids, "attention_mask": mask, "response_mask": alive, "logprob": lp,
                  "token_version": versions, "spans": [s.spans for _, s in samples],
                  "prompt": [g.prompt.text for g, _ in samples],
                  "completion": [tok.decode(s.tokens, skip_special_tokens=True) for _, s in samples],
                  "target": [g.prompt.meta.get("target", "") for g, _ in samples],
                  "meta": [g.prompt.meta for g, _ in samples]}
        if any(s.pixels is not None for _, s in samples):        # prompts with pictures: theirs, for the trainer
            fields["pixel_values"] = [s.pixels for _, s in samples]
            fields["image_key"] = torch.tensor([image_key(s.pixels) for _, s in samples], dtype=torch.long)
        meta = {"prompt_len": P, "temperature": self.options.temperature,
                "prompt_aligned": {"input_ids": tok.pad_token_id, "attention_mask": 0}}
        return SampleBatch(step, [g.prompt.group for g, _ in samples], lo, hi, fields, meta)

    def in_flight(self) -> list[int]:
        if self.agents is not None and self.agents.spans is not None:
            return self.agents.spans.in_flight()
        return self.carry.in_flight() if self.carry is not None else []

    def carry_state(self) -> dict:
        """What this base keeps in a checkpoint: the unfinished samples (tokens, logprobs, versions; the next
        firing's seed comes from its step) and the weights guard's counts."""
        out = {"nonfinite": self.nonfinite.state_dict()}
        if self.agents is not None and self.agents.spans is not None:
            return {**out, "agent_spans": self.agents.spans.state_dict()}
        return {**out, "carry": self.carry.state_dict()} if self.carry is not None else out

    def load_carry(self, state: dict) -> None:
        self.nonfinite.load_state_dict(state.get("nonfinite"))
        if "agent_spans" in state and self.agents is not None and self.agents.spans is not None:
            self.agents.spans.load_state_dict(state["agent_spans"])
        elif self.carry is not None and "carry" in state:
            self.carry.load_state_dict(state["carry"])

    def evaluate(self, prompts: list[Prompt]) -> dict:
        """Greedy completions of the held-out prompts, scored later by the reward node."""
        out, metas, of = self._sample(prompts, 1, greedy=True, seed=0)
        last = {j: i for i, j in enumerate(of)}          # an agent's episode split in samples: its last one
        return {"prompt": [p.text for p in prompts], "completion": [out["completion"][last[j]] for j in range(len(prompts))],
                "target": [p.meta.get("target", "") for p in prompts], "meta": [metas[last[j]] for j in range(len(prompts))],
                "version": self.version}

    def encode(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, the same on every backend (:func:`nodes.tasks.prompting.encode`)."""
        return encode(self.tok, prompt, self.ctx.model.name)

    def encode_all(self, prompts: list[Prompt]) -> tuple[list[list[int]], list | None]:
        """Each prompt's token ids and, where any prompt has pictures, each one's pixel values (``None`` for a
        prompt without): the model's processor expands the pictures' placeholders (:mod:`nodes.models.vision`)."""
        if not any(p.images for p in prompts):
            return [self.encode(p) for p in prompts], None
        proc, name = getattr(self, "processor", None), self.ctx.model.name
        ids, pixels = [], []
        for p in prompts:
            i, v = encode_pictures(self.tok, proc, p, name) if p.images else (self.encode(p), None)
            ids.append(i)
            pixels.append(v)
        return ids, pixels

    def stop_ids(self) -> list[int]:
        """The end-of-sequence token and the option ``stop`` strings (single tokens)."""
        tok = self.tok
        return [tok.eos_token_id] + [tok.convert_tokens_to_ids(tok.tokenize(s))[0] for s in self.options.stop
                                     if tok.tokenize(s)]
