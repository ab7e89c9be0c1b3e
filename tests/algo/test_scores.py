"""algo/scores.py: running moments, score normalisation, reward shaping (the KL penalty, clipping,
the missing-EOS penalty, a group baseline) and the statistics of groups, by hand."""

import json
import statistics

import pytest
import torch

from hydrappo.algo.scores import RunningMoments, group_statistics, normalize_scores, shape_rewards

from tensors import close


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
    rewards, _ = shape_rewards(
        SCORES, LOGP, REF, MASK, 0.0, cliprange_reward=2.0, ended_with_eos=ended, missing_eos_penalty=-5.0
    )
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


GROUP_SCORES = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # two prompts, G = 4; the second all equal


def test_shape_rewards_with_a_group_baseline_and_without_a_reference():
    logprobs = torch.zeros(4, 2)
    mask = torch.ones(4, 2)
    rewards, _ = shape_rewards(torch.tensor([1.0, 3.0, 5.0, 5.0]), logprobs, None, mask, 0.0, group_baseline=2)
    close(rewards[:, -1], [-1.0, 1.0, 0.0, 0.0], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        shape_rewards(torch.ones(4), logprobs, None, mask, 0.1)


def test_group_statistics_measure_the_signal():
    stats = group_statistics(GROUP_SCORES, 4)
    assert stats == {"env/groups_all_equal_frac": 0.5}  # a 2 is not a pass/fail score: no solve rate
    stats = group_statistics(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2)
    assert stats == {"env/groups_all_equal_frac": 0.5, "env/solve_rate": 0.75}
    assert group_statistics(torch.tensor([0.0, 1.0]), 1) == {"env/solve_rate": 0.5}
