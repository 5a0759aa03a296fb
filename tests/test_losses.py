"""The policy loss and advantages against hand-computed examples."""

import math

import pytest
import torch

from nodes.models.tokens import token_logprobs
from nodes.trainer.losses import policy_loss
from nodes.rewards.scorer import grpo_advantages


def example():
    """Two samples x two tokens; the second token of sample B is padding."""
    old = torch.zeros(2, 2)
    cur = torch.tensor([[math.log(1.5), 0.0], [math.log(0.5), 0.7]])
    behav = torch.tensor([[-math.log(3.0), 0.0], [0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return cur, old, behav, adv, mask


class TestPolicyLoss:
    def test_clipping_importance_weight_and_token_mean_by_hand(self):
        # A1: ratio 1.5 -> clipped 1.2, w = min(3, 2) = 2 -> -2.4 ; A2: ratio 1 -> -1
        # B1: ratio 0.5, A = -1 -> min(-0.5, -0.8) = -0.8 -> +0.8 ; B2 masked
        out = policy_loss(*example(), clip=0.2, is_cap=2.0)
        assert float(out.loss) == pytest.approx((-2.4 - 1.0 + 0.8) / 3)
        assert float(out.clip_frac) == pytest.approx(2 / 3)
        assert float(out.is_mean) == pytest.approx(4 / 3)
        assert float(out.is_max) == pytest.approx(2.0)
        assert float(out.ratio_max) == pytest.approx(1.5)
        # A1's weight exp(0 + log 3) = 3 was truncated to 2; its gap is log 3, B1's and A2's are 0
        assert float(out.is_trunc_frac) == pytest.approx(1 / 3)
        assert float(out.gap_mean) == pytest.approx(math.log(3.0) / 3) and float(out.gap_max) == pytest.approx(math.log(3.0))

    def test_without_staleness_the_weight_is_one_and_it_is_plain_ppo(self):
        cur, old, _, adv, mask = example()
        out = policy_loss(cur, old, old, adv, mask, clip=0.2)
        assert float(out.is_mean) == 1.0 and float(out.is_trunc_frac) == 0 and float(out.gap_max) == 0
        assert float(out.loss) == pytest.approx((-1.2 - 1.0 + 0.8) / 3)

    def test_micro_batches_with_a_shared_denominator_sum_to_the_token_mean(self):
        cur, old, behav, adv, mask = example()
        whole = policy_loss(cur, old, behav, adv, mask)
        parts = [policy_loss(cur[i:i + 1], old[i:i + 1], behav[i:i + 1], adv[i:i + 1], mask[i:i + 1],
                             denominator=mask.sum()) for i in range(2)]
        assert float(sum(p.loss for p in parts)) == pytest.approx(float(whole.loss))

    def test_gradient_is_zero_where_the_ratio_is_clipped(self):
        cur, old, behav, adv, mask = example()
        cur = cur.clone().requires_grad_(True)
        policy_loss(cur, old, behav, adv, mask, clip=0.2).loss.backward()
        assert cur.grad[0, 0] == 0 and cur.grad[1, 0] == 0    # both clipped tokens
        assert cur.grad[0, 1] != 0 and cur.grad[1, 1] == 0    # unclipped token; padding

    def test_kl_term_is_zero_at_the_reference(self):
        cur, old, behav, adv, mask = example()
        out = policy_loss(cur, old, behav, adv, mask, ref_logprob=cur.clone(), kl_coef=0.1)
        assert float(out.kl) == pytest.approx(0.0)

    def test_token_logprobs_use_the_temperature(self):
        logits = torch.tensor([[[2.0, 0.0]]])
        t = torch.tensor([[0]])
        assert float(token_logprobs(logits, t, 2.0)) == pytest.approx(math.log(math.e / (math.e + 1)))


class TestAdvantages:
    def test_group_normalised_with_std(self):
        adv = grpo_advantages([1.0, 0.0, 0.5, 0.5], [7, 7, 8, 8], normalize_std=True)
        std = math.sqrt(0.5)   # sample std of {1, 0}
        assert adv[0] == pytest.approx(0.5 / (std + 1e-6)) and adv[1] == pytest.approx(-0.5 / (std + 1e-6))
        assert adv[2:] == [0.0, 0.0]

    def test_only_centred_without_std(self):
        assert grpo_advantages([3.0, 1.0], [0, 0], normalize_std=False) == [1.0, -1.0]
