import json
import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrappo.algo.advantages import gae
from hydrappo.algo.losses import PolicyTokens, PPOLossSettings, SampledTokens, aggregate, ppo_loss
from hydrappo.algo.masked import explained_variance, last_true_index, masked_mean, masked_sum, masked_var, whiten
from hydrappo.algo.scores import RunningMoments, normalize_scores, shape_rewards

GARBAGE = [math.nan, math.inf, -math.inf, 1e30]


def loss_of(logprobs, old_logprobs, advantages, values, old_values, returns, action_mask, *, entropy=None,
            ref_logprobs=None, loss_denominator=None, **settings):  # fmt: skip
    """ppo_loss of the tensors in the order its formula names them, with PPOLossSettings(**settings)."""
    new = PolicyTokens(logprobs, values=values, entropy=entropy)
    old = SampledTokens(old_logprobs, advantages, action_mask, old_values, returns, ref_logprobs)
    return ppo_loss(new, old, PPOLossSettings(**settings), loss_denominator)


def close(actual, expected, **kwargs):
    torch.testing.assert_close(torch.as_tensor(actual).float(), torch.as_tensor(expected).float(), **kwargs)


def pad(x, extra, fill=GARBAGE):
    """Append `extra` columns; garbage for data, 0 for masks."""
    if x.dtype == torch.bool or fill == 0:
        return torch.cat([x, torch.zeros(x.shape[0], extra, dtype=x.dtype)], dim=1)
    cols = torch.tensor([fill[i % len(fill)] for i in range(extra)], dtype=x.dtype)
    return torch.cat([x.detach(), cols.expand(x.shape[0], extra)], dim=1)


def mask_from_lengths(lengths, width, dtype=torch.bool):
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(dtype)


# ---------------------------------------------------------------------------- masked statistics
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, math.nan]])
M = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)


def test_masked_sum_mean_var_by_hand():
    close(masked_sum(X, M), 1.0 + 2.0 + 3.0 + 4.0)
    close(masked_sum(X, M, dim=-1), [1.0 + 2.0 + 3.0, 4.0])
    close(masked_mean(X, M), (1.0 + 2.0 + 3.0 + 4.0) / 4)
    close(masked_mean(X, M, dim=-1), [(1.0 + 2.0 + 3.0) / 3, 4.0 / 1])
    squares = (1 - 2.5) ** 2 + (2 - 2.5) ** 2 + (3 - 2.5) ** 2 + (4 - 2.5) ** 2
    close(masked_var(X, M), squares / (4 - 1))
    close(masked_var(X, M, unbiased=False), squares / 4)
    close(masked_var(X, M), statistics.variance([1.0, 2.0, 3.0, 4.0]))


def test_float_and_bool_masks_agree():
    for fn in (masked_sum, masked_mean, masked_var, whiten):
        close(fn(X, M.float()), fn(X, M))


def test_empty_selections_give_zero_not_nan():
    empty = torch.zeros_like(M)
    assert masked_mean(X, empty).item() == 0.0
    close(masked_mean(X, torch.tensor([[1, 0, 0], [0, 0, 0]]), dim=-1), [1.0, 0.0])
    # One token: no unbiased variance, and it whitens to 0.
    one = torch.tensor([[0, 1, 0], [0, 0, 0]])
    assert masked_var(X, one).item() == 0.0
    assert torch.all(whiten(X, one) == 0)


def test_whiten_by_hand():
    mean, var = 2.5, statistics.variance([1.0, 2.0, 3.0, 4.0])
    expected = torch.tensor([[(v - mean) / math.sqrt(var + 1e-8) for v in (1.0, 2.0, 3.0)], [(4.0 - mean) / math.sqrt(var + 1e-8), 0, 0]])
    close(whiten(X, M), expected)
    # shift_mean=False adds the mean back (lm-human-preferences), still 0 on padding.
    close(whiten(X, M, shift_mean=False), (expected + mean) * M)


def test_explained_variance_by_hand():
    values = torch.tensor([[1.0, 1.0, 0.5, -0.1, 7.0]])
    returns = torch.tensor([[0.0, 2.0, 1.0, 0.0, math.nan]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    residual = [0.0 - 1.0, 2.0 - 1.0, 1.0 - 0.5, 0.0 - -0.1]
    expected = 1 - statistics.pvariance(residual) / statistics.pvariance([0.0, 2.0, 1.0, 0.0])
    close(explained_variance(values, returns, mask), expected)
    close(explained_variance(returns, returns, mask), 1.0)
    assert math.isnan(explained_variance(values, torch.ones_like(returns), mask).item())


def test_last_true_index():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert last_true_index(mask).tolist() == [2, 2, -1, 3]


# ---------------------------------------------------------------------------- scores
def test_running_moments_equal_torch_over_everything_seen():
    batches = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([10.0]), torch.tensor([-3.0, 0.5, 0.25, 8.0, 2.0])]
    moments = RunningMoments()
    returned = [moments.update(b) for b in batches]
    everything = torch.cat(batches).double()
    assert moments.count == 9
    assert moments.mean == pytest.approx(everything.mean().item())
    assert moments.std == pytest.approx(everything.std().item())
    assert returned[0] == pytest.approx((7.0 / 3, statistics.stdev([1.0, 2.0, 4.0])))
    assert returned[1] == (10.0, 0.0)  # one score has no sample std

    restored = RunningMoments()
    restored.load_state_dict(json.loads(json.dumps(moments.state_dict())))
    assert (restored.count, restored.mean, restored.std) == (moments.count, moments.mean, moments.std)
    restored.update(torch.tensor([5.0]))
    assert restored.mean == pytest.approx(torch.cat([everything, torch.tensor([5.0]).double()]).mean().item())


def test_normalize_scores():
    scores = torch.tensor([1.0, 2.0, 6.0])
    assert normalize_scores(scores, "none") is scores

    moments = RunningMoments()
    moments.update(torch.tensor([0.0, 3.0]))
    out = normalize_scores(scores, "running", moments=moments)
    seen = [0.0, 3.0, 1.0, 2.0, 6.0]  # this batch is included before normalising
    close(out, [(s - statistics.mean(seen)) / (statistics.stdev(seen) + 1e-8) for s in (1.0, 2.0, 6.0)])

    close(normalize_scores(scores, "ref", ref_mean=2.0, ref_std=4.0), [(1 - 2) / 4, (2 - 2) / 4, (6 - 2) / 4])


def test_normalize_scores_errors():
    scores = torch.tensor([1.0])
    with pytest.raises(ValueError, match="RunningMoments"):
        normalize_scores(scores, "running")
    with pytest.raises(ValueError, match="ref_mean and ref_std"):
        normalize_scores(scores, "ref", ref_mean=0.0)
    with pytest.raises(ValueError, match="ref_std > 0"):
        normalize_scores(scores, "ref", ref_mean=0.0, ref_std=0.0)
    with pytest.raises(ValueError, match="none, running, ref"):
        normalize_scores(scores, "zscore")


# ---------------------------------------------------------------------------- shape_rewards
LOGP = torch.tensor([[-0.5, -1.0, -0.2], [-0.3, -0.7, 0.0]])
REF = torch.tensor([[-0.6, -0.8, -0.2], [-0.1, 5.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])
SCORES = torch.tensor([1.5, -20.0])


def test_shape_rewards_by_hand():
    rewards, stats = shape_rewards(SCORES, LOGP, REF, MASK, 0.1)
    # k1 = logp - ref: row 0: 0.1, -0.2, 0.0; row 1: -0.2 then padding.
    expected = torch.tensor(
        [
            [-0.1 * 0.1, -0.1 * -0.2, -0.1 * 0.0 + 1.5],
            [-0.1 * -0.2 + -20.0, 0.0, 0.0],
        ]
    )
    close(rewards, expected)
    assert stats["kl_token_mean"] == pytest.approx((0.1 - 0.2 + 0.0 - 0.2) / 4)
    assert stats["kl_seq_mean"] == pytest.approx(((0.1 - 0.2 + 0.0) + -0.2) / 2)
    assert stats["score_mean"] == pytest.approx((1.5 - 20.0) / 2)
    assert stats["non_score_reward_mean"] == pytest.approx((-0.1 * (0.1 - 0.2) + -0.1 * -0.2) / 2)
    assert "missing_eos_frac" not in stats
    assert all(isinstance(v, float) for v in stats.values())


def test_shape_rewards_other_estimator_and_no_kl():
    rewards, _ = shape_rewards(SCORES, LOGP, REF, MASK, 0.1, kl_estimator="k2")
    close(rewards[0], [-0.1 * 0.5 * 0.1**2, -0.1 * 0.5 * 0.2**2, 1.5])
    rewards, stats = shape_rewards(SCORES, LOGP, REF, MASK, 0.1, kl_in_reward=False)
    close(rewards, [[0.0, 0.0, 1.5], [-20.0, 0.0, 0.0]])
    assert stats["non_score_reward_mean"] == 0.0


def test_shape_rewards_clip_and_missing_eos_penalty():
    ended = torch.tensor([False, True])
    rewards, stats = shape_rewards(
        SCORES, LOGP, REF, MASK, 0.0, cliprange_reward=10.0, ended_with_eos=ended, missing_eos_penalty=-1.0
    )
    # Row 0 never ended: its 1.5 is replaced by -1.0. Row 1's -20 is clipped to -10.
    close(rewards, [[0.0, 0.0, -1.0], [-10.0, 0.0, 0.0]])
    assert stats["missing_eos_frac"] == 0.5
    assert stats["score_mean"] == pytest.approx((-1.0 + -10.0) / 2)
    # The penalty is applied before clipping.
    rewards, _ = shape_rewards(SCORES, LOGP, REF, MASK, 0.0, cliprange_reward=2.0, ended_with_eos=ended, missing_eos_penalty=-5.0)
    assert rewards[0, 2].item() == -2.0
    # Without a penalty the EOS flags only feed the stats.
    rewards, stats = shape_rewards(SCORES, LOGP, REF, MASK, 0.0, ended_with_eos=ended)
    close(rewards, [[0.0, 0.0, 1.5], [-20.0, 0.0, 0.0]])
    assert stats["missing_eos_frac"] == 0.5
    with pytest.raises(ValueError, match="ended_with_eos"):
        shape_rewards(SCORES, LOGP, REF, MASK, 0.0, missing_eos_penalty=-1.0)


def test_shape_rewards_empty_response_and_holes():
    mask = torch.tensor([[0, 0, 0], [1, 0, 1]])
    rewards, stats = shape_rewards(SCORES, LOGP, REF, mask, 0.1)
    # Empty row: nothing at all. Row with a hole: score on the last True (index 2).
    close(rewards, [[0.0, 0.0, 0.0], [-0.1 * -0.2, 0.0, -0.1 * 0.0 + -20.0]])
    assert stats["score_mean"] == -20.0


def test_shape_rewards_validates_shapes():
    with pytest.raises(ValueError, match="ref_logprobs has shape"):
        shape_rewards(SCORES, LOGP, REF[:, :2], MASK, 0.1)
    with pytest.raises(ValueError, match="scores must have shape"):
        shape_rewards(SCORES[:1], LOGP, REF, MASK, 0.1)


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
    left, left_returns = gae(pad(rewards.flip(1), 2).flip(1), pad(values.flip(1), 2).flip(1), torch.tensor([[0, 0, 1, 1, 1]]), gamma, lam)
    close(left, torch.cat([torch.zeros(1, 2), right], 1))
    close(left_returns, torch.cat([torch.zeros(1, 2), right_returns], 1))
    # A hole ends an episode: the token before it bootstraps from V = 0.
    holed, _ = gae(rewards, values, torch.tensor([[1, 0, 1]]), gamma, lam)
    close(holed, [[0.5 + gamma * 0.0 - 0.3, 0.0, 1.0 - 0.4]])


def test_gae_is_detached():
    values = VALUES.clone().requires_grad_()
    advantages, returns = gae(REWARDS, values, GAE_MASK, 1.0, 0.95)
    assert not advantages.requires_grad and not returns.requires_grad


# ---------------------------------------------------------------------------- ppo_loss
# Four tokens, one per case of the clipped surrogate (eps = 0.2):
# A = +1, r = 1.5 (clipped) | A = +1, r = 0.5 | A = -1, r = 0.5 (clipped) | A = -1, r = 1.5
OLD = torch.tensor([[-1.0, -1.0, -2.0, -2.0]])
NEW = OLD + torch.tensor([[math.log(1.5), math.log(0.5), math.log(0.5), math.log(1.5)]])
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
V = torch.tensor([[1.0, 1.0, 0.5, -0.1]])
OLD_V = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
RET = torch.tensor([[0.0, 2.0, 1.0, 0.0]])
ONES = torch.ones(1, 4)


def test_ppo_loss_by_hand():
    loss, stats = loss_of(NEW, OLD, ADV, V, OLD_V, RET, ONES, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1)
    # max(-A r, -A clip(r)): max(-1.5, -1.2), max(-0.5, -0.8), max(0.5, 0.8), max(1.5, 1.2)
    policy = (-1.2 + -0.5 + 0.8 + 1.5) / 4
    # 0.5 max((v - R)^2, (clip(v, v_old +- 0.2) - R)^2), clipped v = 0.7, 0.7, 0.5, -0.1
    value = 0.5 * (max(1.0**2, 0.7**2) + max(1.0**2, (0.7 - 2) ** 2) + max(0.5**2, 0.5**2) + 0.1**2) / 4
    assert stats["loss/policy"] == pytest.approx(policy)
    assert stats["loss/value"] == pytest.approx(value)
    assert stats["loss/total"] == pytest.approx(policy + 0.1 * value)
    close(loss, policy + 0.1 * value)
    assert stats["policy/clipfrac"] == pytest.approx(2 / 4)
    assert stats["val/clipfrac"] == pytest.approx(1 / 4)
    assert stats["policy/ratio_mean"] == pytest.approx((1.5 + 0.5 + 0.5 + 1.5) / 4)
    assert stats["policy/ratio_max"] == pytest.approx(1.5)
    # k3 of new vs old: exp(old - new) - 1 - (old - new) = 1/r - 1 + log r
    approxkl = ((1 / 1.5 - 1 + math.log(1.5)) + (1 / 0.5 - 1 + math.log(0.5))) / 2
    assert stats["policy/approxkl"] == pytest.approx(approxkl)
    assert stats["val/mean"] == pytest.approx((1.0 + 1.0 + 0.5 - 0.1) / 4)
    assert stats["returns/mean"] == pytest.approx((0.0 + 2.0 + 1.0 + 0.0) / 4)
    residual = [0.0 - 1.0, 2.0 - 1.0, 1.0 - 0.5, 0.0 - -0.1]
    assert stats["val/var_explained"] == pytest.approx(1 - statistics.pvariance(residual) / statistics.pvariance([0.0, 2.0, 1.0, 0.0]))
    assert "loss/entropy" not in stats and "loss/kl" not in stats
    assert all(isinstance(v, float) for v in stats.values())


def test_clipped_surrogate_gradient_is_zero_exactly_when_clipped():
    logprobs = NEW.clone().requires_grad_()
    loss, _ = loss_of(logprobs, OLD, ADV, V, OLD_V, RET, ONES, vf_coef=0.0)
    loss.backward()
    grad = logprobs.grad[0]
    # (A > 0, r > 1 + eps) and (A < 0, r < 1 - eps): exactly 0.
    assert grad[0].item() == 0.0 and grad[2].item() == 0.0
    # d(-A r)/dlogp = -A r, averaged over the 4 tokens.
    close(grad[1], -1.0 * 0.5 / 4)
    close(grad[3], 1.0 * 1.5 / 4)


def test_value_gradient_is_zero_when_value_clipping_binds():
    values = V.clone().requires_grad_()
    loss, _ = loss_of(NEW, OLD, ADV, values, OLD_V, RET, ONES, vf_coef=1.0)
    loss.backward()
    # Token 1 takes the clipped branch, whose clip(v) is flat in v.
    assert values.grad[0, 1].item() == 0.0
    close(values.grad[0, 0], 0.5 * 2 * (1.0 - 0.0) / 4)


def test_dual_clip():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(4.0), math.log(1.5)]])
    adv = torch.tensor([[-1.0, -1.0]])
    zeros = torch.zeros(1, 2)
    _, plain = loss_of(new, old, adv, zeros, zeros, zeros, torch.ones(1, 2))
    loss, stats = loss_of(new, old, adv, zeros, zeros, zeros, torch.ones(1, 2), dual_clip=3.0)
    assert plain["loss/policy"] == pytest.approx((4.0 + 1.5) / 2)
    # min(max(-A r, -A clip(r)), -c A) with c = 3: min(4, 3) and min(1.5, 3).
    assert stats["loss/policy"] == pytest.approx((3.0 + 1.5) / 2)
    assert stats["policy/dual_clipfrac"] == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        loss_of(new, old, adv, zeros, zeros, zeros, torch.ones(1, 2), dual_clip=1.0)


def test_entropy_bonus_and_kl_in_loss():
    entropy = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    ref = NEW - 0.1  # logp - ref = 0.1 everywhere
    base, _ = loss_of(NEW, OLD, ADV, V, OLD_V, RET, ONES)
    loss, stats = loss_of(NEW, OLD, ADV, V, OLD_V, RET, ONES, ent_coef=0.01, entropy=entropy)
    assert stats["loss/entropy"] == stats["policy/entropy"] == pytest.approx(2.5)
    close(loss, base - 0.01 * (1.0 + 2.0 + 3.0 + 4.0) / 4)

    loss, stats = loss_of(NEW, OLD, ADV, V, OLD_V, RET, ONES, ref_logprobs=ref, kl_coef=0.5, kl_estimator="k3")
    k3 = math.exp(-0.1) - 1 + 0.1
    assert stats["loss/kl"] == pytest.approx(k3, rel=1e-4)
    close(loss, base + 0.5 * k3)

    logprobs = NEW.clone().requires_grad_()
    loss_of(logprobs, OLD, torch.zeros_like(ADV), V, OLD_V, RET, ONES, ref_logprobs=ref, kl_coef=0.5)[0].backward()
    # d/dlogp of 0.5 * mean(exp(ref - logp) - 1 - (ref - logp)) = 0.5 * (1 - exp(-0.1)) / 4
    close(logprobs.grad, torch.full((1, 4), 0.5 * (1 - math.exp(-0.1)) / 4))


def test_aggregation_modes_two_rows_of_unequal_length():
    # ratio 1, so the per-token policy loss is -A; row 0 has 3 tokens, row 1 one; row 2 is empty.
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 50.0, 60.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    zeros = torch.zeros(3, 3)
    values = torch.tensor([[1.0, 1.0, 2.0], [2.0, 9.0, 9.0], [5.0, 5.0, 5.0]])  # value loss 0.5 v^2, unclipped
    expected = {
        "token-mean": (-(1 + 2 + 3 + 4) / 4, 0.5 * (1 + 1 + 4 + 4) / 4),
        "seq-mean-token-mean": (-((1 + 2 + 3) / 3 + 4 / 1) / 2, 0.5 * ((1 + 1 + 4) / 3 + 4 / 1) / 2),
        "seq-mean-token-sum": (-((1 + 2 + 3) + 4) / 2, 0.5 * ((1 + 1 + 4) + 4) / 2),
    }
    for mode, (policy, value) in expected.items():
        _, stats = loss_of(zeros, zeros, adv, values, values, zeros, mask, loss_agg_mode=mode, vf_coef=1.0)
        assert stats["loss/policy"] == pytest.approx(policy), mode
        assert stats["loss/value"] == pytest.approx(value), mode
        assert aggregate(-adv, mask, mode).item() == pytest.approx(policy), mode
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum"):
        loss_of(zeros, zeros, adv, values, values, zeros, mask, loss_agg_mode="sum")


def test_ppo_loss_validates():
    args = (NEW, OLD, ADV, V, OLD_V, RET, ONES)
    with pytest.raises(ValueError, match="old_values has shape"):
        loss_of(NEW, OLD, ADV, V, OLD_V[:, :3], RET, ONES)
    with pytest.raises(ValueError, match="entropy has shape"):
        loss_of(*args, entropy=torch.ones(2, 4))
    with pytest.raises(ValueError, match="needs the per-token entropy"):
        loss_of(*args, ent_coef=0.01)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        loss_of(*args, kl_coef=0.1)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        loss_of(*args, ref_logprobs=OLD, kl_coef=0.1, kl_estimator="k9")


# ---------------------------------------------------------------------------- padding invariance
def test_padding_columns_with_garbage_change_nothing():
    torch.manual_seed(0)
    lengths = [4, 2, 3]
    mask = mask_from_lengths(lengths, 4)
    # In float64: the padded columns change the widths the sums run over, and with them the order
    # of their terms. Values are O(1) (<= 10 after shaping), every sum has <= 7 terms, and the
    # deepest chain (GAE over 4 steps, then whitening, the loss and its gradient) is ~10 sums
    # long: off by <= 10 * 7 * 2**-53 * 10 ~ 8e-14, so 1e-12 (absolute and relative). Garbage
    # that leaked through the mask would show as nan, inf or 1e30.
    logp, old, ref, adv, values, old_values, entropy = (torch.randn(3, 4, dtype=torch.float64) for _ in range(7))
    scores = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    base = dict(logp=logp, old=old, ref=ref, adv=adv, values=values, old_values=old_values, entropy=entropy)
    padded = {k: pad(v, 3) for k, v in base.items()}
    wide_mask = pad(mask, 3)

    def run(t, m):
        rewards, reward_stats = shape_rewards(scores, t["logp"], t["ref"], m, 0.1, cliprange_reward=1.5)
        advantages, returns = gae(rewards, t["values"], m, 0.99, 0.95)
        whitened = whiten(advantages, m)
        logprobs = t["logp"].clone().requires_grad_()
        new_values = t["values"].clone().requires_grad_()
        loss, loss_stats = loss_of(
            logprobs, t["old"], whitened, new_values, t["old_values"], returns, m,
            ent_coef=0.01, entropy=t["entropy"], ref_logprobs=t["ref"], kl_coef=0.2, dual_clip=3.0,
            loss_agg_mode="seq-mean-token-mean",
        )
        loss.backward()
        return dict(
            rewards=rewards, advantages=advantages, returns=returns, whitened=whitened,
            grad_logp=logprobs.grad, grad_values=new_values.grad, loss=loss.detach(),
        ), {**reward_stats, **loss_stats}

    narrow, narrow_stats = run(base, mask)
    wide, wide_stats = run(padded, wide_mask)
    for name in narrow:
        assert narrow[name].dtype == torch.float64, name
        if narrow[name].dim() == 2:
            torch.testing.assert_close(wide[name][:, :4], narrow[name], atol=1e-12, rtol=1e-12, msg=name)
            assert torch.all(wide[name][:, 4:] == 0), name
            assert torch.all(narrow[name][~mask] == 0), name
        else:
            torch.testing.assert_close(wide[name], narrow[name], atol=1e-12, rtol=1e-12, msg=name)
    assert narrow_stats.keys() == wide_stats.keys()
    for key in narrow_stats:
        assert wide_stats[key] == pytest.approx(narrow_stats[key], rel=1e-12, abs=1e-12), key
        assert math.isfinite(narrow_stats[key]), key


# ---------------------------------------------------------------------------- properties
@st.composite
def batches(draw):
    batch = draw(st.integers(1, 4))
    width = draw(st.integers(1, 7))
    lengths = draw(st.lists(st.integers(0, width), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**16))
    mask_dtype = draw(st.sampled_from([torch.bool, torch.float32, torch.long]))
    return mask_from_lengths(lengths, width, mask_dtype), torch.Generator().manual_seed(seed)


def check_per_token(x, mask, name):
    assert x.shape == mask.shape, name
    assert torch.isfinite(x).all(), name
    assert torch.all(x[mask == 0] == 0), name


@settings(max_examples=50, deadline=None)
@given(batches(), st.sampled_from(["k1", "k2", "k3", "abs"]), st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]))
def test_properties_on_random_right_padded_batches(case, estimator, agg_mode):
    mask, gen = case
    shape = mask.shape

    def rand(scale=1.0):
        return torch.randn(shape, generator=gen) * scale

    logp, ref, old = -rand().abs(), -rand().abs(), -rand().abs()
    scores = torch.randn(shape[0], generator=gen)
    ended = torch.rand(shape[0], generator=gen) > 0.5
    rewards, reward_stats = shape_rewards(
        scores, logp, ref, mask, 0.05, kl_estimator=estimator, cliprange_reward=1.0, ended_with_eos=ended, missing_eos_penalty=-1.0
    )
    check_per_token(rewards, mask, "rewards")
    # Without the KL part, a non-empty row's rewards are its (penalised, clipped) score on one token.
    score_only, _ = shape_rewards(scores, logp, ref, mask, 0.0, cliprange_reward=1.0, ended_with_eos=ended, missing_eos_penalty=-1.0)
    expected = torch.where(ended, scores, -1.0).clamp(-1, 1) * mask.bool().any(-1)
    close(score_only.sum(-1), expected)
    assert torch.all((score_only != 0).sum(-1) <= 1)
    advantages, returns = gae(rewards, rand(), mask, 0.99, 0.95)
    check_per_token(advantages, mask, "advantages")
    check_per_token(returns, mask, "returns")
    whitened = whiten(advantages, mask)
    check_per_token(whitened, mask, "whitened")
    if int(mask.bool().sum()) > 1:
        assert abs(masked_mean(whitened, mask).item()) < 1e-4

    logprobs = logp.clone().requires_grad_()
    loss, stats = loss_of(
        logprobs, old, whitened, rand(), rand(), returns, mask, entropy=rand().abs(), ent_coef=0.01,
        ref_logprobs=ref, kl_coef=0.1, kl_estimator=estimator, loss_agg_mode=agg_mode,
    )
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    check_per_token(logprobs.grad, mask, "grad")
    for key, value in {**reward_stats, **stats}.items():
        assert isinstance(value, float), key
        assert math.isfinite(value) or key == "val/var_explained", key
