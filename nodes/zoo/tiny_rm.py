"""The embedded reward model ``tiny-rm``: a learned proxy of the ``digits`` task's gold reward.

The classic RLHF setup, small enough to build offline in seconds: a
``Qwen2ForSequenceClassification`` (one regression output, 0.1M parameters,
the ``tiny`` policy's character tokenizer) trained to predict
:func:`nodes.rewards.rules.digits_match` of ``prompt + completion``. Its training
pairs are ``digits`` prompts (training split) with the target corrupted at
random: exact copies, substituted, dropped or extra digits, truncations, and
what the warm-started ``tiny`` policy typically writes (random 3-4 digit
numbers, ``:`` and more digits after the answer, letters, nothing). The
tokenizer adds ``<bos>`` and ``<eos>``, so the score is read at ``<eos>``
(Hugging Face's last-token pooling; ``pad_token_id`` is in the config).

Its fit on held-out numbers (the task's eval split, never trained on) is
printed at build time and kept in ``fit.json`` in the model folder: about 0.77
correlation with the gold reward. An imperfect proxy, as reward models are:
the ``score`` node of ``graphs/grpo_reward_model.yaml`` logs the gold reward
beside it (``gold: digits_match``) so a run shows whether RL against the proxy
also raises the true reward.

Built once per ``model.seed`` and cached under ``$OMNIGRAPH_CACHE`` like
``tiny`` (registered under ``omnigraph.models`` as ``tiny-rm``).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from nodes.models import cached
from nodes.zoo.tiny import build_tokenizer
from nodes.rewards.rules import digits_match
from nodes.tasks.procedural import Digits

RM = {"hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "max_position_embeddings": 128}
TRAIN = {"steps": 400, "batch": 128, "lr": 3e-3, "warmup": 0.1, "held_out": 2000}
VERSION = 1
DIGITS = "0123456789"


def tiny_rm(seed: int = 0, log=print) -> Path:
    """The embedded reward model's folder, built once per seed (registered as the model ``tiny-rm``)."""
    return cached("tiny-rm", [VERSION, RM, TRAIN], seed, build_tiny_rm, log)


def build_tokenizer_rm():
    """``tiny``'s tokenizer (same ids), adding ``<bos>`` before and ``<eos>`` after each text, padding right."""
    from tokenizers import processors

    tok = build_tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", tok.bos_token_id), ("<eos>", tok.eos_token_id)])
    tok.padding_side = "right"
    return tok


def pairs(task: Digits, n: int, seed: int, held_out: bool = False) -> list[tuple[str, float]]:
    """``n`` (prompt + completion, gold reward) pairs, from the task's training or held-out numbers."""
    rng = random.Random(seed)
    out: list[tuple[str, float]] = []
    step = 0
    while len(out) < n:
        prompts = task.eval_set() if held_out else task.batch(step)
        for p in prompts:
            completion = " " + corrupt(rng, p.meta["target"])
            out.append((p.text + completion, digits_match(p.text, completion, target=p.meta["target"])))
        step += 1
        if held_out:
            rng = random.Random(f"{seed}:{step}")   # the same prompts again, other corruptions
    return out[:n]


def corrupt(rng: random.Random, t: str) -> str:
    """An answer to ``copy <t>:``: right, partly right, or the warm-started policy's typical noise."""
    def digits(lo, hi):
        return "".join(rng.choice(DIGITS) for _ in range(rng.randint(lo, hi)))
    u = rng.random()
    if u < 0.2:
        return t
    if u < 0.5:                                          # some digits replaced
        s = list(t)
        for i in rng.sample(range(len(t)), rng.randint(1, len(t))):
            s[i] = rng.choice(DIGITS)
        return "".join(s)
    if u < 0.62:                                         # cut short, or digits added
        return t[:rng.randint(1, len(t) - 1)] if rng.random() < 0.5 else t + digits(1, 2)
    if u < 0.7:                                          # one digit dropped or inserted
        i = rng.randrange(len(t))
        return t[:i] + t[i + 1:] if rng.random() < 0.5 else t[:i] + rng.choice(DIGITS) + t[i:]
    if u < 0.92:                                         # the warm-started policy: a random number
        return digits(2, 5)
    v = rng.random()                                     # and its other habits
    head = t if rng.random() < 0.5 else digits(3, 4)
    if v < 0.4:
        return head + ":" + digits(2, 5)
    if v < 0.6:
        return head + " " + digits(1, 4)
    if v < 0.8:
        return ""
    return "".join(rng.choice("abcxyz:" + DIGITS) for _ in range(rng.randint(1, 5)))


def build_tiny_rm(target: Path, seed: int, log=print) -> None:
    """Create, train and save the reward model atomically (a temporary folder, then rename)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    t0 = time.perf_counter()
    log(f"building the embedded reward model tiny-rm (seed {seed}, once; cached in {target.parent})")
    tok = build_tokenizer_rm()
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), num_labels=1, problem_type="regression", tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, **RM)
    model = Qwen2ForSequenceClassification(config)
    train = pairs(Digits(prompts=TRAIN["batch"], seed=seed + 2_000_003), TRAIN["steps"] * TRAIN["batch"], seed)
    held = pairs(Digits(prompts=1, seed=seed + 3_000_017, eval_prompts=500), TRAIN["held_out"], seed + 1,
                 held_out=True)
    _train(model, tok, train, log)
    fit = {"correlation": None, "rmse": None, "held_out_pairs": len(held), "train_pairs": len(train),
           "gold": "nodes.rewards.rules:digits_match"}
    fit["correlation"], fit["rmse"] = _fit(model, tok, held)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "fit.json").write_text(json.dumps(fit, indent=1) + "\n")
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = sum(p.numel() for p in model.parameters())
    log(f"tiny-rm ready: {n / 1e6:.1f}M parameters in {time.perf_counter() - t0:.0f} s; held-out fit to "
        f"digits_match: correlation {fit['correlation']:.3f}, rmse {fit['rmse']:.3f}")


def _train(model, tok, data: list[tuple[str, float]], log) -> None:
    """Mean squared error on the gold reward, AdamW with a one-cycle learning rate."""
    import torch

    steps, batch = TRAIN["steps"], TRAIN["batch"]
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=TRAIN["lr"], total_steps=steps, pct_start=TRAIN["warmup"])
    model.train()
    for s in range(steps):
        chunk = data[s * batch:(s + 1) * batch]
        enc = tok([x for x, _ in chunk], return_tensors="pt", padding=True)
        loss = model(**enc, labels=torch.tensor([y for _, y in chunk])).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (s + 1) % (steps // 4) == 0:
            log(f"  tiny-rm step {s + 1}/{steps}: mse {loss.item():.4f}")
    model.eval()


def _fit(model, tok, data: list[tuple[str, float]]) -> tuple[float, float]:
    """Pearson correlation and RMSE of the model's scores against the gold rewards."""
    import torch

    scores: list[float] = []
    with torch.inference_mode():
        for i in range(0, len(data), 500):
            enc = tok([x for x, _ in data[i:i + 500]], return_tensors="pt", padding=True)
            scores += model(**enc).logits[:, 0].tolist()
    gold = [y for _, y in data]
    ms, mg = sum(scores) / len(scores), sum(gold) / len(gold)
    cov = sum((s - ms) * (g - mg) for s, g in zip(scores, gold))
    var = math.sqrt(sum((s - ms) ** 2 for s in scores) * sum((g - mg) ** 2 for g in gold))
    rmse = math.sqrt(sum((s - g) ** 2 for s, g in zip(scores, gold)) / len(gold))
    return round(cov / var, 4), round(rmse, 4)
