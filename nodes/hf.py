"""``generate`` with backend ``hf``: batched sampling with transformers, per-token logprobs, versions.

Each rollout rank samples ``samples_per_prompt`` completions for its share of
the step's prompts. Output fields (first dimension: samples):

- ``input_ids`` ``[B, P + C]``: the prompt left-padded to the step's longest
  prompt ``P``, then the completion right-padded to ``C = max_new_tokens``;
- ``attention_mask`` ``[B, P + C]``; ``response_mask`` ``[B, C]`` (completion
  tokens up to and including the stop token);
- ``logprob`` ``[B, C]``: log-probabilities of the sampled tokens under the
  sampling policy ``softmax(logits / temperature)``, the behaviour policy of
  the decoupled PPO loss;
- ``prompt``, ``completion``, ``target`` (texts, for the reward).

New weights (``Weights`` from ``sync``) are loaded when their version changes:
full state dicts, or LoRA adapter tensors.
"""

from __future__ import annotations

import time
import zlib

import torch

from omnigraph.data import SampleBatch, Weights
from nodes import models
from nodes.losses import token_logprobs


def step_seed(seed: int, step: int, rank: int, salt: str = "gen") -> int:
    return zlib.crc32(f"{salt}:{seed}:{step}:{rank}".encode())


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding (what ``generate`` uses), so trainer and rollout agree."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


class Rollout:
    """What every generate backend shares: the step's prompts, the batch it returns, the eval.

    A backend provides ``tok``, ``version``, ``apply(weights)`` and
    ``sample(texts, n, greedy=, seed=)`` returning the fields documented in this module.
    """

    def __call__(self, step: int, weights: Weights) -> dict:
        self.apply(weights)
        ctx, task = self.ctx, self.ctx.spec.task
        prompts = ctx.task.batch(step)
        longest = max(self.prompt_len(p.text) for p in prompts)
        per = len(prompts) // ctx.world
        mine = prompts[ctx.rank * per:(ctx.rank + 1) * per]
        t0 = time.perf_counter()
        out = self.sample([p.text for p in mine], task.samples_per_prompt, greedy=False,
                          seed=step_seed(ctx.seed, step, ctx.rank))
        dt = time.perf_counter() - t0
        out = _left_pad(out, longest, self.tok.pad_token_id)
        n = len(out["completion"])
        k = task.samples_per_prompt
        groups = [step * task.prompts + ctx.rank * per + i // k for i in range(n)]
        fields = {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"],
                  "response_mask": out["response_mask"], "logprob": out["logprob"],
                  "prompt": [mine[i // k].text for i in range(n)], "completion": out["completion"],
                  "target": [mine[i // k].meta.get("target", "") for i in range(n)]}
        batch = SampleBatch(step, groups, [self.version] * n, [self.version] * n, fields,
                            meta={"prompt_len": longest, "temperature": self.spec.temperature})
        ctx.log(response_len=float(out["response_mask"].sum(1).mean()),
                gen_tokens_per_s=float(out["response_mask"].sum()) / max(dt, 1e-9))
        if self._eval_due(step) and ctx.rank == 0:
            batch.meta["eval"] = self.evaluate()
        return {"rollout": batch}

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids, the same on every backend.

        Plain tasks: bos + the tokenizer's ids for ``text`` (nothing else added). Chat tasks
        (``task.chat``): the model's chat template around the task's system message and ``text``,
        ending with the assistant turn's opening."""
        task, tok = self.ctx.task, self.tok
        if getattr(task, "chat", False):
            if not tok.chat_template:
                raise ValueError(f"task {self.ctx.spec.task.name} is a chat task but the model's tokenizer has "
                                 "no chat template")
            msgs = [{"role": "system", "content": task.SYSTEM}] if getattr(task, "SYSTEM", None) else []
            text = tok.apply_chat_template(msgs + [{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
            return tok(text, add_special_tokens=False).input_ids
        return [tok.bos_token_id] + tok(text, add_special_tokens=False).input_ids

    def prompt_len(self, text: str) -> int:
        return len(self.encode(text))

    def _eval_due(self, step: int) -> bool:
        every = self.spec.eval_every
        last = self.ctx.spec.schedule.iterations - 1
        return bool(every) and (step % every == 0 or step == last)

    def evaluate(self) -> dict:
        """Greedy completions of the held-out prompts, scored later by the reward node."""
        prompts = self.ctx.task.eval_set()
        out = self.sample([p.text for p in prompts], 1, greedy=True, seed=0)
        return {"prompt": [p.text for p in prompts], "completion": out["completion"],
                "target": [p.meta.get("target", "") for p in prompts], "version": self.version}



class Generate(Rollout):
    def __init__(self, name, spec, ctx):
        self.spec, self.ctx = spec, ctx
        g = ctx.spec
        path = models.resolve(g.model.path, g.model.seed)
        self.device = ctx.device          # cuda for a pool with gpus > 0; outputs are host tensors
        self.model, self.tok = models.load(path, g.model.dtype, self.device)
        self.model.eval()
        self.version = 0
        self.lora = next((n.lora for n in g.nodes.values() if n.kind == "update" and n.lora), None)
        if self.lora is not None:
            from peft import LoraConfig, get_peft_model
            self.model = get_peft_model(self.model, LoraConfig(r=self.lora.r, lora_alpha=self.lora.alpha,
                                                               target_modules=self.lora.target_modules))
        stops = [self.tok.convert_tokens_to_ids(self.tok.tokenize(s))[0] for s in spec.stop if self.tok.tokenize(s)]
        self.stop_ids = [self.tok.eos_token_id] + stops

    # -- weights -------------------------------------------------------------
    def apply(self, weights: Weights) -> None:
        if weights.version == self.version or weights.tensors is None:
            return
        if getattr(weights.tensors, "in_model", False):      # received over NCCL into the model already
            self.version = weights.version
            return
        t0 = time.perf_counter()
        if weights.payload == "lora":
            from peft import set_peft_model_state_dict
            set_peft_model_state_dict(self.model, dict(weights.tensors))      # peft wants a dict
        else:
            self.model.load_state_dict(weights.tensors, strict=True)
        if self.device != "cpu":
            torch.cuda.synchronize()
        self.version = weights.version
        self.ctx.log(load_weights_s=time.perf_counter() - t0)

    def receive(self, weights: Weights) -> Weights:
        """Weights sent over NCCL (``omnigraph.weightsync``), received on arrival straight into the model's
        parameters, bucket by bucket (the harness calls this when the next generate uses this version)."""
        from omnigraph import weightsync
        meta = weights.tensors
        if weights.payload == "lora":
            from peft import get_peft_model_state_dict
            targets = get_peft_model_state_dict(self.model)
        else:
            targets = self.model.state_dict()
        weightsync.receive(meta, weightsync.member(meta.group), targets)
        return Weights(weights.version, tensors=weightsync.InModel(meta), payload=weights.payload,
                       nbytes=weights.nbytes)

    def state_dict(self) -> dict:
        return {"version": self.version, "model": self.model.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.version = state["version"]

    # -- sampling ------------------------------------------------------------
    @torch.no_grad()
    def sample(self, texts: list[str], n: int, *, greedy: bool, seed: int) -> dict:
        tok, s = self.tok, self.spec
        prompts = [self.encode(t) for t in texts]
        P = max(len(p) for p in prompts)
        ids = torch.tensor([[tok.pad_token_id] * (P - len(p)) + p for p in prompts]).repeat_interleave(n, 0)
        mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts]).repeat_interleave(n, 0)
        torch.manual_seed(seed)
        out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                  do_sample=not greedy,
                                  temperature=s.temperature if not greedy else None,
                                  top_p=s.top_p if not greedy else None, top_k=0 if not greedy else None,
                                  max_new_tokens=s.max_new_tokens, eos_token_id=self.stop_ids,
                                  pad_token_id=tok.pad_token_id, output_logits=True, return_dict_in_generate=True)
        C = s.max_new_tokens
        comp = out.sequences[:, P:]
        logits = torch.stack(out.logits, dim=1)                       # [B, c, V], c <= C
        c = comp.shape[1]
        alive = torch.ones_like(comp, dtype=torch.float32)
        stop = torch.isin(comp, torch.tensor(self.stop_ids, device=comp.device))
        ended = (stop.cumsum(1) - stop.long()) > 0                    # tokens after the first stop
        alive[ended] = 0.0
        comp = comp.masked_fill(ended, tok.pad_token_id)
        lp = token_logprobs(logits, comp, max(s.temperature, 1e-6)) * alive
        comp, alive, lp = comp.cpu(), alive.cpu(), lp.cpu()           # the batch travels as host tensors
        pad = C - c
        comp = torch.nn.functional.pad(comp, (0, pad), value=tok.pad_token_id)
        alive = torch.nn.functional.pad(alive, (0, pad))
        lp = torch.nn.functional.pad(lp, (0, pad))
        texts_out = [tok.decode(row[m > 0].tolist(), skip_special_tokens=True) for row, m in zip(comp, alive)]
        return {"input_ids": torch.cat([ids, comp], 1),
                "attention_mask": torch.cat([mask, alive.long()], 1),
                "response_mask": alive, "logprob": lp, "completion": texts_out, "prompt_len": P}


def _left_pad(out: dict, width: int, pad_id: int) -> dict:
    """Left-pad the prompt part to ``width`` tokens so every rank of a step has the same shape."""
    P = out["prompt_len"]
    extra = width - P
    if extra > 0:
        out["input_ids"] = torch.nn.functional.pad(out["input_ids"], (extra, 0), value=pad_id)
        out["attention_mask"] = torch.nn.functional.pad(out["attention_mask"], (extra, 0))
    out["prompt_len"] = width
    return out

