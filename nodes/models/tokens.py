"""Log-probabilities and entropy of tokens from a model's logits, under a sampling temperature: what the
rollout records for each sampled token and what the trainer computes for the same tokens.

>>> import torch
>>> logits = torch.tensor([[[2.0, 0.0]]])
>>> round(float(token_logprobs(logits, torch.tensor([[0]]))), 4)
-0.1269
>>> round(float(token_logprobs(logits, torch.tensor([[0]]), suppress=[1])), 4), abs(float(entropy(logits, suppress=[1])))
(0.0, 0.0)

``suppress``: token ids the sampler never samples (an image-text model's image placeholders: one sampled in a
completion would ask the vision tower for a picture that is not there); both sides leave them out of the
softmax, so the rollout's and the trainer's log-probs stay equal.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                   suppress: list[int] | None = None) -> torch.Tensor:
    """log p(token) under ``softmax(logits / temperature)``; logits ``[B, T, V]``, tokens ``[B, T]``."""
    logp = torch.log_softmax(_without(logits.float(), suppress) / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor, temperature: float = 1.0, suppress: list[int] | None = None) -> torch.Tensor:
    logp = torch.log_softmax(_without(logits.float(), suppress) / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _without(logits: torch.Tensor, suppress: list[int] | None) -> torch.Tensor:
    """``logits`` with the ``suppress`` ids far below the rest: probability exactly 0 after the softmax, and a
    finite log-probability (an entropy term ``0 * log 0`` stays 0, not NaN)."""
    if not suppress:
        return logits
    return logits.index_fill(-1, torch.tensor(suppress, device=logits.device), -1e30)
