"""Models: the embedded default ``tiny`` model, and loading any local Hugging Face directory.

``model.path: tiny`` is a small Qwen2-architecture causal LM (0.4M
parameters) with a character-level tokenizer, both made here, offline and
deterministically from ``model.seed``, then cached under
``$OMNIGRAPH_CACHE`` (default ``~/.cache/omnigraph``).

It is *warm-started*, like every model people run RL on: a few seconds of
language modelling on the ``digits`` prompt format, where only 15% of the
answers are right and the rest are random digits. So before RL it knows the
format (``copy 4071: <digits><eos>``) but answers right only about one time
in six (reward about 0.2); RL has to find the right behaviour and make it
the policy's. The warm-start prompts use the training split of the task.
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

from nodes.tasks import Digits

ALPHABET = list("0123456789abcdefghijklmnopqrstuvwxyz :=+-*,.?!\n")
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
TINY = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 128}
WARM = {"steps_right": 800, "steps_noisy": 20, "batch": 64, "lr": 3e-3, "lr_noisy": 3e-4, "p_right": 0.1}
VERSION = 1


def cache_root() -> Path:
    return Path(os.environ.get("OMNIGRAPH_CACHE", Path.home() / ".cache" / "omnigraph"))


def tiny(seed: int = 0, log=print) -> Path:
    """The embedded model's folder, built once per seed (registered as the model ``tiny``)."""
    key = hashlib.sha256(json.dumps([VERSION, TINY, WARM, seed]).encode()).hexdigest()[:10]
    target = cache_root() / "models" / f"tiny-seed{seed}-{key}"
    if not (target / "config.json").exists():
        build_tiny(target, seed, log)
    return target


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
    _warm_start(model, tok, Digits(prompts=WARM["batch"], seed=seed + 1_000_003), seed)
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


def _warm_start(model, tok, task, seed: int) -> None:
    """Two phases of language modelling on the prompt format (see the module docstring):
    right answers teach the format and how to copy; then mostly-wrong answers make copying rare."""
    import torch

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=WARM["lr"], weight_decay=0.0)
    model.train()
    phases = [(WARM["steps_right"], 1.0, WARM["lr"]), (WARM["steps_noisy"], WARM["p_right"], WARM["lr_noisy"])]
    step = 0
    for n, p_right, lr in phases:
        for group in opt.param_groups:
            group["lr"] = lr
        for _ in range(n):
            texts = []
            for p in task.batch(step):
                target = p.meta["target"]
                answer = target if rng.random() < p_right else \
                    "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 4)))
                texts.append(f"{p.text} {answer}")
            enc = tok([tok.bos_token + t + tok.eos_token for t in texts], return_tensors="pt", padding=True,
                      add_special_tokens=False)
            labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
            loss = model(**enc, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
    model.eval()


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


def with_lora(model, lora):
    """``model`` wrapped with peft LoRA adapters as ``lora`` (an ``omnigraph.sdk.Lora``) says."""
    from peft import LoraConfig, get_peft_model
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.target_modules)))


def weight_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
