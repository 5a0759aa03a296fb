"""Log-probabilities and entropy of tokens from a model's logits, under a sampling temperature: what the
rollout records for each sampled token and what the trainer computes for the same tokens.

>>> import torch
>>> logits = torch.tensor([[[2.0, 0.0]]])
>>> round(float(token_logprobs(logits, torch.tensor([[0]]))), 4)
-0.1269
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(token) under ``softmax(logits / temperature)``; logits ``[B, T, V]``, tokens ``[B, T]``."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)
