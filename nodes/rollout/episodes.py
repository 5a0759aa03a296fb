"""Multi-turn episodes (``generate: {env: ...}``): the model and an environment take turns.

Any generator with ``sample(prefixes, n, greedy=, seed=, max_new_tokens=)`` runs episodes (the ``hf``
and ``vllm`` backends do): each turn samples the next model message of every live episode from its
whole prefix (vLLM reuses the prefix's KV cache), hands the decoded message to the episode's
environment (:mod:`omnigraph.sdk.env`), and appends the observation's tokens. The batch this makes is
the single-turn batch of :mod:`nodes.rollout.base` with a longer completion region (``env.max_tokens``
columns): model and environment tokens interleaved, ``response_mask`` 1 on the model's tokens only
(they alone are trained), ``logprob`` the sampling logprob of each model token. Every token of an
episode is sampled by the weights of one version (the firing's), so the staleness proof and check are
those of single-turn samples.

Overlap. The episodes run in ``env.waves`` waves. Environment steps run on an event loop in a thread of
their own; while wave ``w`` waits for its steps, the rollout generates the next turn of wave ``w + 1``,
so tool time hides behind generation. ``env_overlap_efficiency`` is the share of the loop's wall time
not spent blocked on an environment (1.0: every step was hidden).

Chat prompts: an observation is a message of the environment's ``role`` rendered by the model's chat
template (the tokens between the model's message and the model's next turn, closing the model's turn
when the budget cut it); plain prompts get the observation's text as it is.

Pictures (``EnvStep.images``, an image-text policy): each picture's placeholder is expanded into as many image
tokens as the model's processor gives it, and its pixel inputs are appended to the episode's, which every later
turn and the trainer read. An observation whose pictures would not fit the episode's ``max_tokens`` whole ends
the episode (truncated) unshown.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from omnigraph.sdk import ConfigError, EnvStep, Prompt, load, options_model

from nodes.models import vision
from nodes.models.vision import image_key
from nodes.rollout.agent_pictures import Expander
from nodes.tasks.prompting import messages


def environment_class(name: str):
    try:
        return load("environments", name)
    except LookupError as e:
        raise ConfigError(str(e), where="env.name",
                          fix="name a registered environment (omnigraph.environments) or module:Class") from None


class EventLoop:
    """An asyncio loop in a daemon thread: environment calls are submitted to it and overlap each other."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="omnigraph-env", daemon=True).start()

    def submit(self, fn, *args) -> Future:
        async def call():
            t0 = time.perf_counter()
            if inspect.iscoroutinefunction(fn):
                out = await fn(*args)
            else:
                out = await asyncio.to_thread(fn, *args)
                if inspect.isawaitable(out):
                    out = await out
            return out, time.perf_counter() - t0
        return asyncio.run_coroutine_threadsafe(call(), self.loop)


def after_message(tok, base: str, said: str, stopped: bool) -> tuple[str, int]:
    """``(closing, at)``: what the chat template put after the model's last message ``said`` in ``base`` (the
    rendered conversation), and where that message ends in it; without the end-of-sequence token when the
    model ``stopped`` on it (it already wrote the end of its turn)."""
    at = base.rfind(said) + len(said) if said and said in base else len(base)
    closing = base[at:]
    eos = tok.eos_token or ""
    if stopped and eos and closing.startswith(eos):
        closing = closing[len(eos):]
    return closing, at


@dataclass
class Episode:
    prompt: Prompt
    env: Any
    ids: list[int]
    prompt_len: int
    chat: list[dict[str, str]] | None
    tokens: list[int] = field(default_factory=list)
    model: list[float] = field(default_factory=list)
    logprob: list[float] = field(default_factory=list)
    transcript: list[dict[str, str]] = field(default_factory=list)
    turns: int = 0
    reward: float = 0.0
    tool_calls: int = 0
    env_s: float = 0.0
    steps: int = 0
    done: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    pending: Future | None = None
    stopped: bool = False           # the model's last turn ended with a stop token
    pixels: Any = None              # the first prompt's pixel values (prompts with pictures), read every turn

    def left(self, budget: int) -> int:
        return budget - len(self.tokens)

    def add(self, tokens: list[int], trained: bool, logprobs: list[float] | None = None) -> None:
        self.tokens += tokens
        self.ids = self.ids + tokens
        self.model += [1.0 if trained else 0.0] * len(tokens)
        self.logprob += logprobs if logprobs is not None else [0.0] * len(tokens)

    def record(self) -> dict[str, Any]:
        return {"reward": self.reward, "turns": self.turns, "tool_calls": self.tool_calls, "done": self.done,
                "truncated": self.truncated, "messages": list(self.transcript), "info": dict(self.info)}


class Episodes:
    """The multi-turn loop of one rollout (built once; ``run`` per batch)."""

    def __init__(self, rollout):
        self.rollout, self.tok = rollout, rollout.tok
        self.spec = rollout.options.env
        self.cls = environment_class(self.spec.name)
        model = options_model(self.cls)             # the environment's options, typed where it declares them
        self.env_kwargs = dict(model.model_validate(self.spec.options)) if model else dict(self.spec.options)
        self.role = getattr(self.cls, "role", "user")
        proc = getattr(rollout, "processor", None)
        self.expander = Expander(proc) if proc is not None else None      # an image-text policy's pictures
        self.loop = EventLoop()
        self.stats: dict[str, float] = {}
        self.spans: list[tuple[str, float, float]] = []

    # -- observations ----------------------------------------------------------
    def observation_ids(self, e: Episode, text: str, pics: list[bytes] = ()) -> list[int]:
        tok = self.tok
        if e.chat is None:
            if pics and vision.PLACEHOLDER not in text:
                text = vision.PLACEHOLDER * len(pics) + text
            return tok(self._expand(text, pics), add_special_tokens=False).input_ids
        base = tok.apply_chat_template(e.chat, tokenize=False)
        content = [{"type": "image"}] * len(pics) + [{"type": "text", "text": text}] if pics else text
        e.chat.append({"role": self.role, "content": content})
        full = tok.apply_chat_template(e.chat, add_generation_prompt=True, tokenize=False)
        said = e.chat[-2]["content"]
        closing, at = after_message(tok, base, said, e.stopped)
        delta = full[len(base):] if full.startswith(base) else full[at:]
        return tok(self._expand(closing + delta, pics), add_special_tokens=False).input_ids

    def _expand(self, text: str, pics) -> str:
        """``text`` with each picture's placeholder expanded into its image tokens (none: as it is)."""
        if not pics:
            return text
        found = text.count(vision.PLACEHOLDER) + (text.count(self.expander.token)
                                                 if self.expander.token != vision.PLACEHOLDER else 0)
        if found != len(pics):
            raise ValueError(f"environment {self.spec.name}: an observation with {len(pics)} picture(s) says "
                             f"'{vision.PLACEHOLDER}' {found} times (one per picture, or none to show them first)")
        return self.expander.expand(text, list(pics))

    def _pictures(self, step: EnvStep) -> tuple[list[bytes], list]:
        """The observation's pictures and their decoded images, checked: an image-text policy, files PIL reads."""
        pics = [bytes(b) for b in step.images or ()]
        if pics and self.expander is None:
            raise ValueError(f"environment {self.spec.name} showed pictures to a model that takes none: use an "
                             "image-text policy, or an environment of text")
        return pics, vision.open_images(pics, f"environment {self.spec.name}'s observation")

    # -- the loop --------------------------------------------------------------
    def _apply(self, e: Episode, step: EnvStep, dt: float) -> None:
        if not isinstance(step, EnvStep):
            raise TypeError(f"environment {self.spec.name}: step() returned {type(step).__name__}, not an EnvStep")
        e.reward += float(step.reward)
        e.tool_calls += int(step.tool_calls)
        e.env_s += dt
        e.steps += 1
        e.info.update(step.info)
        e.done = e.done or bool(step.done)
        if e.done or not (step.observation or step.images) or e.turns >= self.spec.max_turns:
            return
        pics, images = self._pictures(step)
        ids = self.observation_ids(e, step.observation or "", pics)
        room = e.left(self.spec.max_tokens)
        if len(ids) >= room:                   # no room left for the model to answer
            e.truncated, e.done = True, True
            if pics:                           # a picture is shown whole or not at all
                return
            ids = ids[:room]
        e.add(ids, trained=False)
        if pics:
            shown = vision.pixel_inputs(self.expander.proc, images)
            e.pixels = shown if e.pixels is None else vision.concat([e.pixels, shown])
        e.transcript.append({"role": self.role, "content": step.observation or "",
                             **({"images": len(pics)} if pics else {})})

    def _resolve(self, e: Episode) -> float:
        if e.pending is None:
            return 0.0
        t0 = time.perf_counter()
        try:
            step, dt = e.pending.result()
        except Exception as err:  # noqa: BLE001 - a user's environment: name it, keep the cause
            raise RuntimeError(f"environment {self.spec.name} failed in step(): {type(err).__name__}: {err}") from err
        finally:
            e.pending = None
        waited = time.perf_counter() - t0
        self._apply(e, step, dt)
        return waited

    def run(self, prompts: list[Prompt], n: int, *, greedy: bool, seed: int) -> tuple[dict, list[Episode]]:
        r, spec, opts = self.rollout, self.spec, self.rollout.options
        eps = []
        first, pixels = r.encode_all(prompts)
        for i, p in enumerate(prompts):
            for _ in range(n):
                ids = list(first[i])
                chat = messages(p) if (p.chat or p.messages) else None
                eps.append(Episode(p, self.cls(p, **self.env_kwargs), ids, len(ids), chat,
                                   pixels=None if pixels is None else pixels[i]))
        t_start = time.perf_counter()
        waited = 0.0
        for f in [self.loop.submit(e.env.reset) for e in eps if hasattr(e.env, "reset")]:
            f.result()
        waited = time.perf_counter() - t_start             # the rollout waited for every reset
        waves = [eps[i::spec.waves] for i in range(min(spec.waves, len(eps)))]
        gen_s, calls = 0.0, 0
        self.spans = []
        while True:
            busy = False
            for w, wave in enumerate(waves):
                t0 = time.perf_counter()
                w_wait = sum(self._resolve(e) for e in wave)
                if w_wait > 1e-3:
                    self.spans.append(("env wait", t0, time.perf_counter()))
                waited += w_wait
                live = [e for e in wave if not e.done and e.turns < spec.max_turns and e.left(spec.max_tokens) > 0]
                if not live:
                    continue
                busy = True
                cap = min(opts.max_new_tokens, max(e.left(spec.max_tokens) for e in live))
                t0 = time.perf_counter()
                seen = [e.pixels for e in live]
                shown = {"pixels": seen} if any(p is not None for p in seen) else {}
                out = r.sample([e.ids for e in live], 1, greedy=greedy, seed=(seed + 7919 * calls) % 2**31,
                               max_new_tokens=cap, **shown)
                gen_s += time.perf_counter() - t0
                self.spans.append((f"turn {live[0].turns + 1}", t0, time.perf_counter()))
                calls += 1
                comp = out["input_ids"][:, out["prompt_len"]:]
                for i, e in enumerate(live):
                    keep = out["response_mask"][i] > 0
                    toks = comp[i][keep].tolist()[:e.left(spec.max_tokens)]
                    lps = out["logprob"][i][keep].tolist()[:len(toks)]
                    e.stopped = bool(toks) and toks[-1] in r.stops
                    e.add(toks, trained=True, logprobs=lps)
                    e.turns += 1
                    text = self.tok.decode(toks, skip_special_tokens=True)
                    e.transcript.append({"role": "assistant", "content": text})
                    if e.chat is not None:
                        e.chat.append({"role": "assistant", "content": text})
                    e.pending = self.loop.submit(e.env.step, text)
            if not busy and all(e.pending is None for e in eps):
                break
        for e in eps:
            e.truncated = e.truncated or (not e.done and e.left(spec.max_tokens) <= 0)
        wall = time.perf_counter() - t_start
        self.stats = {"turns_mean": sum(e.turns for e in eps) / len(eps),
                      "tool_calls_per_episode": sum(e.tool_calls for e in eps) / len(eps),
                      "env_latency_s": sum(e.env_s for e in eps) / max(sum(e.steps for e in eps), 1),
                      "env_s": sum(e.env_s for e in eps), "env_wait_s": waited, "episode_gen_s": gen_s,
                      "episode_s": wall, "env_overlap_efficiency": (wall - waited) / max(wall, 1e-9),
                      "tokens_per_turn": sum(sum(e.model) for e in eps) / max(sum(e.turns for e in eps), 1),
                      "env_tokens_per_episode": sum(len(e.model) - sum(e.model) for e in eps) / len(eps),
                      "episodes_done": sum(e.done for e in eps) / len(eps),
                      "episodes_truncated": sum(e.truncated for e in eps) / len(eps)}
        return self._batch(eps), eps

    def _batch(self, eps: list[Episode]) -> dict:
        """The episodes as one sample dict (the fields of ``Rollout.sample``)."""
        pad, C = self.tok.pad_token_id, self.spec.max_tokens
        P = max(e.prompt_len for e in eps)
        B = len(eps)
        ids = torch.full((B, P + C), pad, dtype=torch.long)
        mask = torch.zeros((B, P + C), dtype=torch.long)
        trained, lp = torch.zeros((B, C)), torch.zeros((B, C))
        for i, e in enumerate(eps):
            prompt = e.ids[:e.prompt_len]
            ids[i, P - len(prompt):P] = torch.tensor(prompt)
            mask[i, P - len(prompt):P] = 1
            t = len(e.tokens)
            if t:
                ids[i, P:P + t] = torch.tensor(e.tokens)
                mask[i, P:P + t] = 1
                trained[i, :t] = torch.tensor(e.model)
                lp[i, :t] = torch.tensor(e.logprob)
        last = [next((m["content"] for m in reversed(e.transcript) if m["role"] == "assistant"), "") for e in eps]
        out = {"input_ids": ids, "attention_mask": mask, "response_mask": trained, "logprob": lp,
               "completion": last, "prompt_len": P}
        if any(e.pixels is not None for e in eps):               # prompts with pictures: theirs, for the trainer
            out["pixel_values"] = [e.pixels for e in eps]
            out["image_key"] = torch.tensor([image_key(e.pixels) for e in eps], dtype=torch.long)
        return out
