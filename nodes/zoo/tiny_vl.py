"""The embedded image-text model, ``tiny-vl`` (registered as the model ``tiny-vl``).

A LLaVA-architecture model as transformers ships it (``LlavaForConditionalGeneration``): a CLIP vision
tower (32x32 pictures, 8x8 patches: 16 image tokens), LLaVA's two-layer projector, and the embedded
``tiny`` model's Qwen2 language model and character tokenizer with one more token, ``<image>``, and a chat
template that renders image parts (:data:`CHAT`). Its
processor (``LlavaProcessor`` with CLIP's image processor, the PIL one: no torchvision) is saved beside
the weights, so a user's LLaVA checkpoint and this one load and run alike. Built here, offline and
deterministically from ``model.seed``, then cached under ``$OMNIGRAPH_CACHE`` (~1 minute on 2 cores).

It is warm-started on the ``shapes`` task (:mod:`nodes.tasks.shapes`: name the squares' colour) the way
``tiny`` is on ``digits``, each phase ended by a measured skill: right answers until its greedy answers to
held-out pictures are right ``WARM["learn_until"]`` of the time, then random answers at a small learning
rate until that share has fallen to ``WARM["noisy_until"]``. So before RL it knows the format and the
colours, but names the right one only some of the time; RL has to make seeing the colour its policy. The
loss is the answer's alone (the prompt and the picture's tokens are given).
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from nodes.models import cached, quiet_bars
from nodes.models.vision import open_images
from nodes.tasks.shapes import IMAGE_TOKEN, Shapes
from nodes.zoo.tiny import TINY, build_tokenizer

VISION = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
          "image_size": 32, "patch_size": 8, "projection_dim": 64}
WARM = {"batch": 64, "lr": 1e-3, "learn_until": 0.9, "max_steps": 4000, "check_every": 20,
        "lr_noisy": 2e-4, "p_right": 0.2, "noisy_until": 0.4, "max_noisy_steps": 2000, "probe_prompts": 200}
VERSION = 1
CHAT = ("{{ bos_token }}{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}{% endif %}"
        "{% endfor %}{% endif %}{% if m['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}")
"""Its chat template: a conversation as it was warm-started, with no role markers (the user's turn as a plain
prompt, each image part the placeholder; the assistant's reply and ``<eos>``), so a one-turn chat is exactly the
plain prompt's tokens."""


def tiny_vl(seed: int = 0, log=print) -> Path:
    """The embedded image-text model's folder, built once per seed (registered as the model ``tiny-vl``)."""
    return cached("tiny-vl", [VERSION, TINY, VISION, WARM, CHAT], seed, build_tiny_vl, log)


def build_processor():
    """The tokenizer of ``tiny`` with ``<image>``, and CLIP's PIL image processor at the tower's size."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    side = VISION["image_size"]
    images = CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    tok.chat_template = CHAT
    return LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=VISION["patch_size"],
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          image_token=IMAGE_TOKEN, chat_template=CHAT)


def build_tiny_vl(target: Path, seed: int, log=print) -> None:
    """Create, warm-start and save the model and its processor atomically (a temporary folder, then rename)."""
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    t0 = time.perf_counter()
    log(f"building the embedded image-text model tiny-vl (seed {seed}, once; cached in {target.parent})")
    proc = build_processor()
    tok = proc.tokenizer
    torch.manual_seed(seed)
    text = Qwen2Config(vocab_size=len(tok), tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **TINY)
    config = LlavaConfig(text_config=text.to_dict(), vision_config=CLIPVisionConfig(**VISION).to_dict(),
                         image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN), vision_feature_layer=-1,
                         vision_feature_select_strategy="default", tie_word_embeddings=True)
    model = LlavaForConditionalGeneration(config)
    _warm_start(model, proc, seed, log)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        with quiet_bars():
            model.save_pretrained(tmp, safe_serialization=True)
            proc.save_pretrained(tmp)
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = sum(p.numel() for p in model.parameters())
    log(f"tiny-vl ready: {n / 1e6:.1f}M parameters in {time.perf_counter() - t0:.0f} s")


def _encode(proc, prompts, answers):
    """Prompt, a space, the answer and eos (what the rollout samples after the prompt), as one left-padded
    batch; and each row's first answer position (the prompts are of one text, so of one length)."""
    tok = proc.tokenizer
    texts = [tok.bos_token + f"{p.text} {a}" + tok.eos_token for p, a in zip(prompts, answers)]
    images = [open_images(p.images)[0] for p in prompts]
    enc = proc(text=texts, images=images, return_tensors="pt", padding=True, add_special_tokens=False)
    head = proc(text=[tok.bos_token + prompts[0].text + " "], images=images[:1], add_special_tokens=False)
    pad = (enc.attention_mask == 0).sum(1)
    return enc, pad + len(head["input_ids"][0])


def _warm_start(model, proc, seed: int, log=print) -> None:
    """The two phases of the module docstring, each stopped by :func:`_skill` on held-out pictures."""
    import torch

    rng = random.Random(seed)
    task = Shapes(prompts=WARM["batch"], seed=seed + 1_000_003)
    probes = Shapes(prompts=1, seed=seed + 77, eval_prompts=WARM["probe_prompts"]).eval_set()
    probe_batch = _encode(proc, probes, [p.meta["target"] for p in probes])
    names = sorted({p.meta["target"] for p in task.eval_set()} | {p.meta["target"] for p in probes})
    opt = torch.optim.AdamW(model.parameters(), lr=WARM["lr"], weight_decay=0.0)
    step = 0

    def train(right: bool) -> None:
        nonlocal step
        prompts = task.batch(step)
        answers = [p.meta["target"] if right or rng.random() < WARM["p_right"] else rng.choice(names)
                   for p in prompts]
        enc, start = _encode(proc, prompts, answers)
        cols = torch.arange(enc.input_ids.shape[1])
        labels = enc.input_ids.masked_fill(cols[None, :] < start[:, None], -100)       # the answer and eos
        model.train()
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1

    skill = _skill(model, proc, probe_batch, probes)
    while skill < WARM["learn_until"] and step < WARM["max_steps"]:
        for _ in range(WARM["check_every"]):
            train(right=True)
        skill = _skill(model, proc, probe_batch, probes)
    if skill < WARM["learn_until"]:
        raise RuntimeError(f"tiny-vl did not learn to name colours in {step} steps (held-out accuracy {skill:.2f}); "
                           "report this with your CPU model")
    learned = step
    for group in opt.param_groups:
        group["lr"] = WARM["lr_noisy"]
    while skill > WARM["noisy_until"] and step - learned < WARM["max_noisy_steps"]:
        train(right=False)
        skill = _skill(model, proc, probe_batch, probes)
    log(f"tiny-vl: names colours after {learned} steps, then {step - learned} steps of noise leave a held-out "
        f"accuracy of {skill:.2f}")
    model.eval()


def _skill(model, proc, probe_batch, probes) -> float:
    """The share of held-out pictures whose colour is the model's most likely answer, teacher-forced: the
    colours' names differ in their first letter, so the first answer token decides."""
    import torch

    enc, start = probe_batch
    model.eval()
    with torch.no_grad():
        logits = model(**enc).logits
    rows = torch.arange(len(start))
    guess = logits[rows, start - 1].argmax(-1)
    return float((guess == enc.input_ids[rows, start]).float().mean())
