"""algo/advantages.py: GAE, and the critic-free estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++), on
hand-computed numbers."""

import math

import pytest
import torch

from hydrappo.algo.advantages import (
    dr_grpo_advantages,
    estimate_advantages,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)

from tensors import close, pad


# ---------------------------------------------------------------------------- gae
def test_gae_three_tokens_by_hand():
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[0.5, -0.2, 1.0]])
    values = torch.tensor([[0.3, 0.6, 0.4]])
    delta2 = 1.0 + gamma * 0.0 - 0.4  # after the last token V = 0
    delta1 = -0.2 + gamma * 0.4 - 0.6
    delta0 = 0.5 + gamma * 0.6 - 0.3
    a2 = delta2
    a1 = delta1 + gamma * lam * a2
    a0 = delta0 + gamma * lam * a1
    advantages, returns = gae(rewards, values, torch.ones(1, 3), gamma, lam)
    close(advantages, [[a0, a1, a2]])
    close(returns, [[a0 + 0.3, a1 + 0.6, a2 + 0.4]])


REWARDS = torch.tensor([[0.1, -0.3, 2.0, 0.7], [1.0, 0.5, 0.0, 0.0]])
VALUES = torch.tensor([[0.2, 0.4, -0.5, 1.0], [0.3, -0.2, 0.0, 0.0]])
GAE_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])


def test_gae_lambda_one_is_reward_to_go_minus_value():
    advantages, returns = gae(REWARDS, VALUES, GAE_MASK, 1.0, 1.0)
    reward_to_go = [[0.1 - 0.3 + 2.0 + 0.7, -0.3 + 2.0 + 0.7, 2.0 + 0.7, 0.7], [1.0 + 0.5, 0.5, 0, 0]]
    close(advantages, (torch.tensor(reward_to_go) - VALUES) * GAE_MASK)
    close(returns, torch.tensor(reward_to_go))


def test_gae_lambda_zero_is_one_step_td_error():
    gamma = 0.9
    advantages, _ = gae(REWARDS, VALUES, GAE_MASK, gamma, 0.0)
    td = [
        [0.1 + gamma * 0.4 - 0.2, -0.3 + gamma * -0.5 - 0.4, 2.0 + gamma * 1.0 - -0.5, 0.7 + gamma * 0.0 - 1.0],
        [1.0 + gamma * -0.2 - 0.3, 0.5 + gamma * 0.0 - -0.2, 0.0, 0.0],
    ]
    close(advantages, td)


def test_gae_restarts_at_masked_positions():
    gamma, lam = 0.9, 0.8
    rewards, values = torch.tensor([[0.5, -0.2, 1.0]]), torch.tensor([[0.3, 0.6, 0.4]])
    right, right_returns = gae(rewards, values, torch.ones(1, 3), gamma, lam)
    # Left padding with garbage in front gives the same numbers, shifted.
    left, left_returns = gae(
        pad(rewards.flip(1), 2).flip(1), pad(values.flip(1), 2).flip(1), torch.tensor([[0, 0, 1, 1, 1]]), gamma, lam
    )
    close(left, torch.cat([torch.zeros(1, 2), right], 1))
    close(left_returns, torch.cat([torch.zeros(1, 2), right_returns], 1))
    # A hole ends an episode: the token before it bootstraps from V = 0.
    holed, _ = gae(rewards, values, torch.tensor([[1, 0, 1]]), gamma, lam)
    close(holed, [[0.5 + gamma * 0.0 - 0.3, 0.0, 1.0 - 0.4]])


def test_gae_is_detached():
    values = VALUES.clone().requires_grad_()
    advantages, returns = gae(REWARDS, values, GAE_MASK, 1.0, 0.95)
    assert not advantages.requires_grad and not returns.requires_grad


# ---------------------------------------------------------------------------- estimators by hand
GROUP_SCORES = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # two prompts, G = 4; the second all equal


def test_grpo_normalises_within_each_group_and_an_all_equal_group_gets_zero():
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735; group 2: no spread.
    expected = [0.5 / 0.5773503, -0.5 / 0.5773503, -0.5 / 0.5773503, 0.5 / 0.5773503, 0, 0, 0, 0]
    close(grpo_advantages(GROUP_SCORES, 4), expected, atol=1e-5, rtol=0)
    assert torch.isfinite(grpo_advantages(torch.zeros(4), 4)).all()


def test_dr_grpo_only_centres():
    close(dr_grpo_advantages(GROUP_SCORES, 4), [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0], atol=1e-6, rtol=0)


def test_rloo_subtracts_the_mean_of_the_other_samples():
    leave_one_out = [
        GROUP_SCORES[i] - (GROUP_SCORES[(i // 4) * 4 : (i // 4) * 4 + 4].sum() - GROUP_SCORES[i]) / 3 for i in range(8)
    ]
    close(rloo_advantages(GROUP_SCORES, 4), leave_one_out, atol=1e-6, rtol=0)
    close(rloo_advantages(GROUP_SCORES, 4)[:4], [2 / 3, -2 / 3, -2 / 3, 2 / 3], atol=1e-6, rtol=0)


@pytest.mark.parametrize("estimator", [grpo_advantages, dr_grpo_advantages, rloo_advantages])
def test_a_group_estimator_refuses_one_sample_per_prompt(estimator):
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        estimator(GROUP_SCORES, 1)
    with pytest.raises(ValueError, match="do not split into groups"):
        estimator(GROUP_SCORES[:7], 4)


def test_reinforce_pp_whitens_the_token_returns_over_the_batch():
    rewards = torch.tensor([[-0.1, -0.1, 1.0], [-0.2, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    returns = [0.8, 0.9, 1.0, 0.3, 0.5]  # reward-to-go per real token (gamma = 1)
    mean = sum(returns) / 5
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / 4)
    expected = [
        [(0.8 - mean) / std, (0.9 - mean) / std, (1.0 - mean) / std],
        [(0.3 - mean) / std, (0.5 - mean) / std, 0.0],
    ]
    close(reinforce_pp_advantages(rewards, mask), expected, atol=1e-5, rtol=0)
    advantages, returns_out = estimate_advantages("reinforce_pp_baseline", rewards, None, mask)
    close(advantages, expected, atol=1e-5, rtol=0)  # the baseline variant: same returns, baseline subtracted earlier
    assert returns_out is None


def test_group_estimators_use_the_whole_shaped_reward_of_each_response():
    # Per-token rewards: -beta*KL on every token, the score on the last. The GRPO input is their sum.
    rewards = torch.tensor([[-0.1, 1.0, 0.0], [-0.1, -0.1, 0.0], [0.0, 0.5, 0.0], [0.3, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    advantages, returns = estimate_advantages("dr_grpo", rewards, None, mask, group_size=2)
    # Totals per response: 0.9, -0.2 (group 1), 0.5, 0.3 (group 2); minus each group's mean.
    per_seq = [0.55, -0.55, 0.1, -0.1]
    assert returns is None
    close(advantages, [[per_seq[i] if mask[i, t] else 0.0 for t in range(3)] for i in range(4)], atol=1e-6, rtol=0)
