"""algo/losses.py: the PPO loss by hand (clipping, dual clip, the entropy and KL terms, aggregation
modes, DAPO's clip-higher and GSPO's sequence-level ratios), and the whole chain (shaping, GAE,
whitening, the loss) on padded and random batches."""

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrappo.algo.advantages import gae
from hydrappo.algo.losses import PolicyTokens, PPOLossSettings, SampledTokens, aggregate, ppo_loss
from hydrappo.algo.masked import masked_mean, whiten
from hydrappo.algo.scores import shape_rewards

from tensors import close, mask_from_lengths, pad


def loss_of(
    logprobs,
    old_logprobs,
    advantages,
    values,
    old_values,
    returns,
    action_mask,
    *,
    entropy=None,
    ref_logprobs=None,
    loss_denominator=None,
    **settings,
):
    """ppo_loss of the tensors in the order its formula names them, with PPOLossSettings(**settings)."""
    new = PolicyTokens(logprobs, values=values, entropy=entropy)
    old = SampledTokens(old_logprobs, advantages, action_mask, old_values, returns, ref_logprobs)
    return ppo_loss(new, old, PPOLossSettings(**settings), loss_denominator)


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
    assert stats["val/var_explained"] == pytest.approx(
        1 - statistics.pvariance(residual) / statistics.pvariance([0.0, 2.0, 1.0, 0.0])
    )
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


# ---------------------------------------------------------------------------- loss options
def test_clip_higher_lets_a_positive_advantage_grow_further():
    logprobs = torch.tensor([[math.log(1.25)]], requires_grad=True)
    zeros, ones = torch.zeros(1, 1), torch.ones(1, 1)
    symmetric, stats = loss_of(logprobs, zeros, ones, None, None, None, ones, cliprange=0.2)
    assert symmetric.item() == pytest.approx(-1.2) and stats["policy/clipfrac"] == 1.0
    symmetric.backward()
    assert logprobs.grad.item() == 0.0  # clipped: no gradient
    logprobs.grad = None
    higher, stats = loss_of(logprobs, zeros, ones, None, None, None, ones, cliprange=0.2, cliprange_high=0.28)
    assert higher.item() == pytest.approx(-1.25) and stats["policy/clipfrac"] == 0.0
    higher.backward()
    assert logprobs.grad.item() == pytest.approx(-1.25)
    assert "loss/value" not in stats and "val/var_explained" not in stats  # no critic


def test_sequence_level_ratios_are_gspo():
    # Row 0: log-ratios 0.1 and 0.3 (mean 0.2); row 1: 0.5 on its only token.
    logprobs = torch.tensor([[0.1, 0.3], [0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    advantages = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    zeros = torch.zeros(2, 2)
    loss, stats = loss_of(
        logprobs,
        zeros,
        advantages,
        None,
        None,
        None,
        mask,
        cliprange=0.25,
        importance_sampling_level="sequence",
        loss_agg_mode="seq-mean-token-mean",
    )
    r0, r1 = math.exp(0.2), math.exp(0.5)
    # Row 0: min(r A, clip(r) A) with r = 1.2214 < 1.25, unclipped; row 1: A < 0, max(-A r, -A clip(r)) = r.
    expected = (-r0 + max(r1, 1.25)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats["policy/ratio_max"] == pytest.approx(r1, rel=1e-6)


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
            logprobs,
            t["old"],
            whitened,
            new_values,
            t["old_values"],
            returns,
            m,
            ent_coef=0.01,
            entropy=t["entropy"],
            ref_logprobs=t["ref"],
            kl_coef=0.2,
            dual_clip=3.0,
            loss_agg_mode="seq-mean-token-mean",
        )
        loss.backward()
        return dict(
            rewards=rewards,
            advantages=advantages,
            returns=returns,
            whitened=whitened,
            grad_logp=logprobs.grad,
            grad_values=new_values.grad,
            loss=loss.detach(),
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
@given(
    batches(),
    st.sampled_from(["k1", "k2", "k3", "abs"]),
    st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]),
)
def test_properties_on_random_right_padded_batches(case, estimator, agg_mode):
    mask, gen = case
    shape = mask.shape

    def rand(scale=1.0):
        return torch.randn(shape, generator=gen) * scale

    logp, ref, old = -rand().abs(), -rand().abs(), -rand().abs()
    scores = torch.randn(shape[0], generator=gen)
    ended = torch.rand(shape[0], generator=gen) > 0.5
    rewards, reward_stats = shape_rewards(
        scores,
        logp,
        ref,
        mask,
        0.05,
        kl_estimator=estimator,
        cliprange_reward=1.0,
        ended_with_eos=ended,
        missing_eos_penalty=-1.0,
    )
    check_per_token(rewards, mask, "rewards")
    # Without the KL part, a non-empty row's rewards are its (penalised, clipped) score on one token.
    score_only, _ = shape_rewards(
        scores, logp, ref, mask, 0.0, cliprange_reward=1.0, ended_with_eos=ended, missing_eos_penalty=-1.0
    )
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
        logprobs,
        old,
        whitened,
        rand(),
        rand(),
        returns,
        mask,
        entropy=rand().abs(),
        ent_coef=0.01,
        ref_logprobs=ref,
        kl_coef=0.1,
        kl_estimator=estimator,
        loss_agg_mode=agg_mode,
    )
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    check_per_token(logprobs.grad, mask, "grad")
    for key, value in {**reward_stats, **stats}.items():
        assert isinstance(value, float), key
        assert math.isfinite(value) or key == "val/var_explained", key
