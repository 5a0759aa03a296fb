"""Models: the embedded default ``tiny`` model, and loading any local Hugging Face directory.

``model.path: tiny`` is a small Qwen2-architecture causal LM (0.4M
parameters) with a character-level tokenizer, both made here, offline and
deterministically from ``model.seed``, then cached under
``$OMNIGRAPH_CACHE`` (default ``~/.cache/omnigraph``).

It is *warm-started*, like every model people run RL on, in two phases of
language modelling on the ``digits`` prompt format, each ended by a measured
skill rather than a step count: right answers until it copies (the mean
probability of each right digit on held-out probe prompts reaches
``WARM["copy_until"]``), then random answers at a small learning rate until
that probability has fallen back to ``WARM["noisy_until"]``, just above the
0.1 of random digits. So before RL it knows the format (``copy 4071:
<digits><eos>``) but its samples rarely copy (reward about 0.1); the skill is
buried, not gone, and RL has to find it and make it the policy's. The warm-start prompts use the training split of the task.

Why measured: when a small transformer learns to copy is a phase transition
whose timing depends on the CPU's floating-point kernels. A fixed recipe of
steps learned to copy on one CPU and never on another (AVX2 without
AVX-512), and forgetting it is as abrupt; stopping on the probe gives the
same starting skill on every machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from nodes.tasks.procedural import Digits

ALPHABET = list("0123456789abcdefghijklmnopqrstuvwxyz :=+-*,.?!\n")
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
TINY = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 128}
WARM = {"batch": 64, "lr": 1e-3, "copy_until": 0.99, "max_steps": 3000, "check_every": 25,
        "lr_noisy": 3e-4, "p_right": 0.1, "noisy_until": 0.25, "max_noisy_steps": 2000, "probe_prompts": 128}
VERSION = 2


def cache_root() -> Path:
    return Path(os.environ.get("OMNIGRAPH_CACHE", Path.home() / ".cache" / "omnigraph"))


def cached(name: str, recipe: list, seed: int, build, log=print) -> Path:
    """``cache_root()/models/<name>-seed<seed>-<hash of recipe and seed>``, built by ``build(folder, seed, log)``
    the first time: a change of recipe is a new folder, never a stale model."""
    key = hashlib.sha256(json.dumps([*recipe, seed]).encode()).hexdigest()[:10]
    target = cache_root() / "models" / f"{name}-seed{seed}-{key}"
    if not (target / "config.json").exists():
        build(target, seed, log)
    return target


def tiny(seed: int = 0, log=print) -> Path:
    """The embedded model's folder, built once per seed (registered as the model ``tiny``)."""
    return cached("tiny", [VERSION, TINY, WARM], seed, build_tiny, log)


def build_tokenizer():
    """A character-level byte-level BPE (no merges): one token per character of ``ALPHABET``.

    Byte-level symbols (space is ``Ġ``) and BPE keep it identical under the tokenizer
    class ``AutoTokenizer`` picks for a Qwen2 model, so transformers and vLLM agree.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = [_byte_symbol(c) for c in ALPHABET]
    vocab = {t: i for i, t in enumerate(SPECIAL + symbols)}
    tok = Tokenizer(models.BPE(vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", padding_side="left")


def _byte_symbol(c: str) -> str:
    """GPT-2's byte-to-unicode map for one ASCII character (printable ones map to themselves)."""
    b = ord(c)
    if 33 <= b <= 126:
        return c
    shift = sum(1 for x in range(b) if not (33 <= x <= 126 or 161 <= x <= 172 or 174 <= x <= 255))
    return chr(256 + shift)


def build_tiny(target: Path, seed: int, log=print) -> None:
    """Create, warm-start and save the tiny model atomically (a temporary folder, then rename)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    t0 = time.perf_counter()
    log(f"building the embedded tiny model (seed {seed}, once; cached in {target.parent})")
    tok = build_tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **TINY)
    model = Qwen2ForCausalLM(config)
    _warm_start(model, tok, Digits(prompts=WARM["batch"], seed=seed + 1_000_003), seed, log)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = sum(p.numel() for p in model.parameters())
    log(f"tiny model ready: {n / 1e6:.1f}M parameters in {time.perf_counter() - t0:.0f} s")


def _warm_start(model, tok, task, seed: int, log=print) -> None:
    """The two phases of the module docstring, each stopped by :func:`_copy_skill` on held-out probes."""
    import torch

    rng = random.Random(seed)
    probes = Digits(prompts=WARM["probe_prompts"], seed=seed + 77).eval_set()
    opt = torch.optim.AdamW(model.parameters(), lr=WARM["lr"], weight_decay=0.0)
    step = 0

    def train(right: bool) -> None:
        nonlocal step
        prompts = task.batch(step)
        answers = [p.meta["target"] if right or rng.random() < WARM["p_right"] else
                   "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 4))) for p in prompts]
        enc = _encode(tok, prompts, answers)
        labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
        model.train()
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1

    skill = _copy_skill(model, tok, probes)
    while skill < WARM["copy_until"] and step < WARM["max_steps"]:
        for _ in range(WARM["check_every"]):
            train(right=True)
        skill = _copy_skill(model, tok, probes)
    if skill < WARM["copy_until"]:
        raise RuntimeError(f"the tiny model did not learn to copy in {step} steps (skill {skill:.2f}); "
                           "report this with your CPU model")
    learned = step
    for group in opt.param_groups:
        group["lr"] = WARM["lr_noisy"]
    while skill > WARM["noisy_until"] and step - learned < WARM["max_noisy_steps"]:
        train(right=False)
        skill = _copy_skill(model, tok, probes)
    log(f"tiny model: copies after {learned} steps, then {step - learned} steps of noise leave a right-digit "
        f"probability of {skill:.2f}")
    model.eval()


def _encode(tok, prompts, answers):
    texts = [tok.bos_token + f"{p.text} {a}" + tok.eos_token for p, a in zip(prompts, answers)]
    return tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def _copy_skill(model, tok, probes) -> float:
    """Mean probability of each right answer digit, teacher-forced, over the probe prompts."""
    import torch

    targets = [p.meta["target"] for p in probes]
    enc = _encode(tok, probes, targets)
    model.eval()
    with torch.no_grad():
        logp = model(**enc).logits.float().log_softmax(-1)
    ids = enc.input_ids
    total, count = 0.0, 0
    for i, t in enumerate(targets):
        end = ids.shape[1] - 1                      # the <eos>; the answer's digits sit just before it
        pos = torch.arange(end - len(t), end)
        total += logp[i, pos - 1, ids[i, pos]].exp().sum().item()
        count += len(t)
    return total / count


def load(path: Path, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) from a local directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    return model, tok


def warm(model_dir: Path | None) -> None:
    """Import what :func:`load` needs for the model in ``model_dir`` (its architecture's code, its tokenizer's class)
    without building either. Run in the process Ray's workers are forked from (``runtime.warm_workers``), so that
    every actor starts with them imported."""
    import torch  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    if model_dir is None or not (Path(model_dir) / "config.json").exists():
        return
    config = AutoConfig.from_pretrained(model_dir)
    AutoModelForCausalLM._model_mapping[type(config)]            # imports transformers.models.<type>.modeling_<type>
    tok = Path(model_dir) / "tokenizer_config.json"
    name = json.loads(tok.read_text()).get("tokenizer_class") if tok.exists() else None
    if name:
        tokenizer_class_from_name(name)


def contiguous(model) -> int:
    """Move the model's parameters into one flat buffer per dtype and device, in the order of its state dict
    (tied parameters once), each parameter a view of it; returns the bytes moved.

    A weights export then casts or copies one span instead of one tensor at a time (a pack is laid out in the same
    order: :func:`omnigraph.sdk.tensors.coalesce`): on an H100, Qwen2.5-0.5B's fp32 master weights into the bf16
    hand-over buffer were 290 cast kernels. Call it once, after the model is on its device and before an
    optimizer or a compiled step holds its parameters' addresses.

    The copies run on one thread: a node is built on its actor's main thread, and an OpenMP team opened there
    (a copy large enough to go parallel) slowed every step of the tiny model's colocated sync graph by ~45%
    (0.155 against 0.107 s/step, measured side by side in Ray actors), the steps running on another thread."""
    import torch
    seen, groups = set(), {}
    for t in model.state_dict(keep_vars=True).values():
        if isinstance(t, torch.nn.Parameter) and id(t) not in seen:
            seen.add(id(t))
            groups.setdefault((t.dtype, t.device), []).append(t)
    moved, threads = 0, torch.get_num_threads()
    torch.set_num_threads(1)        # no OpenMP team on this thread (see above)
    try:
        with torch.no_grad():
            for (dtype, device), params in groups.items():
                flat = torch.empty(sum(p.numel() for p in params), dtype=dtype, device=device)
                at = 0
                for p in params:
                    n = p.numel()
                    flat[at:at + n].copy_(p.data.reshape(-1))
                    p.data = flat[at:at + n].view_as(p)
                    at += n
                moved += flat.numel() * flat.element_size()
    finally:
        torch.set_num_threads(threads)
    return moved


def with_lora(model, lora):
    """``model`` wrapped with peft LoRA adapters as ``lora`` (an ``omnigraph.sdk.Lora``) says."""
    from peft import LoraConfig, get_peft_model
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.target_modules)))


def weight_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
