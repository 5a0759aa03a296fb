"""A prompt's token ids, defined once: the rollouts sample from them and the data tasks measure them
(``task.max_prompt_tokens``), so a prompt that passes the length check is exactly what the model reads.

Plain prompts: bos + the tokenizer's ids for the text, nothing else added. Chat prompts (``prompt.chat``,
or ``prompt.messages``): the model's chat template around the messages (``system`` first when set), ending
with the opening of the assistant's turn. Prompts with pictures (``prompt.images``): the same, then the model's
processor expands each picture's placeholder into its image tokens (:func:`encode_pictures`).
"""

from __future__ import annotations

import io

from PIL import Image

from omnigraph.sdk import ConfigError, Prompt
from omnigraph.sdk.adapters.transformers import image_token_counts

from nodes.models import vision


def messages(prompt: Prompt) -> list[dict]:
    if prompt.messages:
        return list(prompt.messages)
    head = [{"role": "system", "content": prompt.system}] if prompt.system else []
    return head + [{"role": "user", "content": prompt.text}]


def encode(tok, prompt: Prompt, model_name: str = "the model") -> list[int]:
    head, text = _parts(tok, prompt, model_name)
    return head + tok(text, add_special_tokens=False).input_ids


def encode_pictures(tok, proc, prompt: Prompt, model_name: str = "the model"):
    """``(ids, pixel_values)`` of a prompt with pictures (:func:`nodes.models.vision.encode`): ``proc`` is the
    model's processor, ``None`` for a model that takes no pictures."""
    head, text = _picture_parts(tok, proc, prompt, model_name)
    return vision.encode(proc, prompt, text, head)


def picture_lengths(tok, proc, prompts: list[Prompt], model_name: str = "the model") -> list[int]:
    """``[len(encode_pictures(tok, proc, p)[0]) for p in prompts]`` without computing a pixel: each picture
    counts the tokens the processor says a picture of its size expands to (read from the file's header)."""
    out = []
    for p in prompts:
        head, text = _picture_parts(tok, proc, p, model_name)
        counts = image_token_counts(proc, [Image.open(io.BytesIO(b)).size[::-1] for b in p.images])
        if counts is None:                      # a processor that does not say: run it
            out.append(len(encode_pictures(tok, proc, p, model_name)[0]))
            continue
        token = getattr(proc, "image_token", vision.PLACEHOLDER)
        text = vision.with_image_tokens(proc, text)
        n = len(head) + len(tok(text, add_special_tokens=False).input_ids)
        out.append(n + sum(counts) - len(counts) * len(tok(token, add_special_tokens=False).input_ids))
    return out


def _picture_parts(tok, proc, prompt: Prompt, model_name: str) -> tuple[list[int], str]:
    """:func:`_parts` for a prompt with pictures: chat rendered by the processor's template (image parts and
    all; else the tokenizer's)."""
    if proc is None:
        raise ConfigError(f"the task's prompts have pictures but '{model_name}' takes none (its config has no "
                          "vision tower)", where="model.path",
                          fix="use an image-text model (LLaVA and its kind; the embedded one is tiny-vl), or a "
                              "task without pictures")
    if prompt.chat or prompt.messages:
        owner = proc if getattr(proc, "chat_template", None) else tok
        if not getattr(owner, "chat_template", None):
            _parts(tok, prompt, model_name)       # says there is no chat template
        return [], owner.apply_chat_template(messages(prompt), add_generation_prompt=True, tokenize=False)
    return _parts(tok, prompt, model_name)


def lengths(tok, prompts: list[Prompt], model_name: str = "the model", batch: int = 1024) -> list[int]:
    """``[len(encode(tok, p, model_name)) for p in prompts]``, the texts tokenized ``batch`` at a time (a data
    task measures every row of its splits)."""
    out: list[int] = []
    for at in range(0, len(prompts), batch):
        parts = [_parts(tok, p, model_name) for p in prompts[at:at + batch]]
        ids = tok([text for _, text in parts], add_special_tokens=False).input_ids
        out += [len(head) + len(i) for (head, _), i in zip(parts, ids)]
    return out


def _parts(tok, prompt: Prompt, model_name: str) -> tuple[list[int], str]:
    """The ids before the text (bos for a plain prompt) and the text to tokenize without special tokens."""
    if prompt.chat or prompt.messages:
        if not tok.chat_template:
            raise ConfigError(f"the task's prompts are chat messages but the tokenizer of '{model_name}' has no "
                              "chat template", where="model.path",
                              fix="use an instruct model with a chat template, or a task of plain prompts "
                                  "(task.chat: false, a prompt field of text)")
        return [], tok.apply_chat_template(messages(prompt), add_generation_prompt=True, tokenize=False)
    return [tok.bos_token_id], prompt.text
