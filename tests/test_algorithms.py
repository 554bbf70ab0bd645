"""Advantage estimators against values worked out by hand."""

import math

import pytest
import torch

from roll_lite.data import DataProto
from roll_lite.loss import kl_penalty, kl_regularized_loss_func, local_mask_stats
from roll_lite.loss.advantages import (
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    kl_shaped_rewards,
    last_token_rewards,
    masked_whiten,
    reinforce_pp_advantages,
    rloo_advantages,
    whitens_advantages,
)

D = torch.float64
# two prompts (groups 0 and 1), three samples each; responses at positions 1..2 (row 2: only 1)
SCORES = torch.tensor([1.0, 0.0, 0.5, 2.0, 2.0, 5.0], dtype=D)
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])
MASK = torch.tensor([[0, 1, 1]] * 6)
MASK[2, 2] = 0


def test_grpo_by_hand():
    adv = grpo_advantages(SCORES, GROUPS, MASK, eps=0.0)
    # group 0: mean 0.5, unbiased std 0.5 -> (1, -1, 0); group 1: mean 3, std sqrt(3) -> (-1,-1,2)/sqrt(3)
    s3 = math.sqrt(3)
    assert adv[:, 1].tolist() == pytest.approx([1, -1, 0, -1 / s3, -1 / s3, 2 / s3])
    assert adv[:, 0].abs().sum() == 0 and adv[2, 2] == 0
    dr = grpo_advantages(SCORES, GROUPS, MASK, normalize_std=False)
    assert dr[:, 1].tolist() == pytest.approx([0.5, -0.5, 0.0, -1, -1, 2])


def test_rloo_by_hand():
    adv = rloo_advantages(SCORES, GROUPS, MASK)
    # row 0: 1 - mean(0, 0.5) = 0.75; row 5: 5 - mean(2, 2) = 3
    assert adv[:, 1].tolist() == pytest.approx([0.75, -0.75, 0.0, -1.5, -1.5, 3.0])
    # a group of one (its others dropped) has no baseline: 0, and the other groups are as before
    alone = rloo_advantages(SCORES[2:], GROUPS[2:], MASK[2:])
    assert alone[0].abs().sum() == 0 and alone[1:, 1].tolist() == pytest.approx([-1.5, -1.5, 3.0])


def test_last_token_rewards():
    rewards = last_token_rewards(SCORES, MASK)
    assert rewards[0].tolist() == [0, 0, 1.0] and rewards[2].tolist() == [0, 0.5, 0]
    empty = last_token_rewards(torch.tensor([3.0]), torch.zeros(1, 3))
    assert empty.abs().sum() == 0


def test_discounted_returns_and_reinforce_pp():
    rewards = torch.tensor([[0.0, 1.0, 2.0]], dtype=D)
    mask = torch.tensor([[0, 1, 1]])
    assert discounted_returns(rewards, mask, 0.5).tolist() == [[0.0, 2.0, 2.0]]
    returns = torch.tensor([[0.0, 1.0, 3.0], [0.0, 5.0, 0.0]], dtype=D)
    mask2 = torch.tensor([[0, 1, 1], [0, 1, 0]])
    white = masked_whiten(returns, mask2, eps=0.0)
    # values 1, 3, 5: mean 3, unbiased variance (4 + 0 + 4) / 2 = 4, std 2 (the population std would be sqrt(8/3))
    assert white[mask2.bool()].tolist() == pytest.approx([-1.0, 0.0, 1.0])
    adv = reinforce_pp_advantages(torch.tensor([[0.0, 0.0, 1.0], [0.0, 3.0, 0.0]], dtype=D), mask2, gamma=1.0)
    # returns: row0 (1, 1), row1 (3): mean 5/3, unbiased variance (4/9 + 4/9 + 16/9) / 2 = 4/3, std 2/sqrt(3)
    s3 = math.sqrt(3)
    assert adv[mask2.bool()].tolist() == pytest.approx([-1 / s3, -1 / s3, 2 / s3], rel=1e-6)


def test_masked_whiten_conventions():
    values = torch.tensor([[7.0, 101.0, 103.0], [9.0, 102.0, -4.0]], dtype=D)
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    white = masked_whiten(values, mask, eps=0.0)
    # the mean (102) is not added back (verl's shift_mean=True); unbiased std of (101, 103, 102) is 1
    assert white.flatten().tolist() == pytest.approx([0.0, -1.0, 1.0, 0.0, 0.0, 0.0])
    # one token: no spread, whitens to 0 (not nan); no token: all zero
    assert masked_whiten(values, torch.tensor([[0, 1, 0], [0, 0, 0]])).abs().sum() == 0
    assert masked_whiten(values, torch.zeros(2, 3)).abs().sum() == 0


def test_which_estimators_whiten_by_default():
    # verl whitens gae and reinforce_plus_plus, not grpo / rloo (already centred per prompt group)
    assert [whitens_advantages(name) for name in ("gae", "reinforce_pp", "grpo", "dr_grpo", "rloo")] == [
        True,
        True,
        False,
        False,
        False,
    ]
    assert whitens_advantages("gae", False) is False and whitens_advantages("rloo", True) is True


def test_gae_by_hand():
    # one row, response tokens 1..2, reward 1 on the last one, V = (9, 0.5, 0.25), gamma 0.9, lambda 0.8
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=D)
    values = torch.tensor([[9.0, 0.5, 0.25]], dtype=D)
    mask = torch.tensor([[0, 1, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    delta2 = 1.0 - 0.25  # terminal: next value 0
    delta1 = 0.0 + 0.9 * 0.25 - 0.5
    assert adv.tolist()[0] == pytest.approx([0.0, delta1 + 0.9 * 0.8 * delta2, delta2])
    assert ret.tolist()[0] == pytest.approx([0.0, delta1 + 0.72 * delta2 + 0.5, delta2 + 0.25])
    # lambda = 1, gamma = 1: advantage = return - value, returns = Monte-Carlo return
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    assert ret.tolist()[0] == pytest.approx([0.0, 1.0, 1.0])


def test_kl_shaped_rewards():
    r = kl_shaped_rewards(
        torch.tensor([[0.0, 1.0]]),
        torch.tensor([[-1.0, -1.0]]),
        torch.tensor([[-2.0, -1.5]]),
        torch.tensor([[0, 1]]),
        kl_coef=0.1,
        estimator="k1",
    )
    assert r.tolist() == [[0.0, pytest.approx(1.0 - 0.05)]]


def test_kl_shaped_rewards_with_clamp():
    # k1 = log π - log π_ref = 3 on the response token: clamped to 2
    r = kl_shaped_rewards(
        torch.tensor([[0.0, 1.0]]),
        torch.tensor([[-1.0, -1.0]]),
        torch.tensor([[-2.0, -4.0]]),
        torch.tensor([[0, 1]]),
        kl_coef=0.1,
        estimator="k1",
        clamp=2.0,
    )
    assert r.tolist() == [[0.0, pytest.approx(1.0 - 0.2)]]


# log π - log π_ref = 0.5, -3, 3 on three tokens (ref = 0)
LOG_RATIO = [0.5, -3.0, 3.0]


def _kl_and_grad(estimator, clamp, log_ratio=LOG_RATIO, dtype=D):
    log_probs = torch.tensor([log_ratio], dtype=dtype, requires_grad=True)
    kl = kl_penalty(log_probs, torch.zeros_like(log_probs), estimator, clamp)
    kl.sum().backward()
    return kl.detach()[0].tolist(), log_probs.grad[0].tolist()


def test_k3_exact_without_clamp():
    # k3(x) = exp(-x) - 1 + x, dk3/dx = 1 - exp(-x)
    kl, grad = _kl_and_grad("k3", None)
    assert kl == pytest.approx([math.exp(-x) - 1 + x for x in LOG_RATIO])
    assert grad == pytest.approx([1 - math.exp(-x) for x in LOG_RATIO])


def test_kl_clamp_zeroes_the_gradient_of_clamped_tokens():
    # k3 = 0.1065, 16.09, 2.050: with c = 2.5 the middle token is clamped to 2.5 and gets no gradient
    kl, grad = _kl_and_grad("k3", 2.5)
    assert kl == pytest.approx([math.exp(-0.5) - 0.5, 2.5, math.exp(-3.0) + 2.0])
    assert grad == pytest.approx([1 - math.exp(-0.5), 0.0, 1 - math.exp(-3.0)])
    # k1 can be negative: clamped to [-c, c] on both sides
    kl, grad = _kl_and_grad("k1", 2.5)
    assert kl == pytest.approx([0.5, -2.5, 2.5]) and grad == pytest.approx([1.0, 0.0, 0.0])
    kl, grad = _kl_and_grad("k2", 2.5)  # 0.5 x^2 = 0.125, 4.5, 4.5; d/dx = x
    assert kl == pytest.approx([0.125, 2.5, 2.5]) and grad == pytest.approx([0.5, 0.0, 0.0])
    # far outliers in float32: exact k3 overflows to inf; clamped it is c with a zero gradient, not nan
    kl, grad = _kl_and_grad("k3", 10.0, [-200.0, 0.0], dtype=torch.float32)
    assert kl == [10.0, 0.0] and grad == [0.0, 0.0]
    with pytest.raises(ValueError, match="clamp must be > 0"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k3", 0.0)


def test_kl_regularized_loss_func_passes_the_clamp():
    log_probs = torch.tensor([LOG_RATIO], dtype=D, requires_grad=True)
    mask = torch.ones(1, 3)
    batch = DataProto(
        {
            "response_mask": mask,
            "kl_mask": mask,
            "advantages": torch.zeros(1, 3, dtype=D),
            "ref_log_probs": torch.zeros(1, 3, dtype=D),
        },
        meta_info={
            "on_policy": True,
            "batch_num_tokens": {k: local_mask_stats(mask)["batch_num_tokens"] for k in ("response_mask", "kl_mask")},
            "global_valid_samples": {
                k: local_mask_stats(mask)["global_valid_samples"] for k in ("response_mask", "kl_mask")
            },
        },
    )
    loss, metrics = kl_regularized_loss_func(kl_coef=1.0, kl_estimator="k3", kl_clamp=2.5)(
        batch, {"log_probs": log_probs}
    )
    clamped = [math.exp(-0.5) - 0.5, 2.5, math.exp(-3.0) + 2.0]
    assert metrics["kl@sum"].item() == pytest.approx(sum(clamped) / 3)
    loss.backward()  # zero advantages: the gradient is the KL term's alone, token-mean over 3 tokens
    assert log_probs.grad[0].tolist() == pytest.approx([(1 - math.exp(-0.5)) / 3, 0.0, (1 - math.exp(-3.0)) / 3])
