"""The embedded default model, ``tiny`` (registered as the model ``tiny``).

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

from nodes.models import cached
from nodes.tasks.procedural import Digits

ALPHABET = list("0123456789abcdefghijklmnopqrstuvwxyz :=+-*,.?!\n")
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
TINY = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 128}
WARM = {"batch": 64, "lr": 1e-3, "copy_until": 0.99, "max_steps": 3000, "check_every": 25,
        "lr_noisy": 3e-4, "p_right": 0.1, "noisy_until": 0.25, "max_noisy_steps": 2000, "probe_prompts": 128}
VERSION = 2


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


