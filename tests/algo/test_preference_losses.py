"""The DPO family's losses (algo/preference.py) against numbers computed by hand.

One pair throughout: the policy's summed log-probs -2 (chosen, 2 tokens) and -5 (rejected, 4
tokens), the reference's -3 and -4. Summed: the policy's gap 3, the reference's 1, logits 2.
Length-averaged: the policy's -1 and -1.25 (gap 0.25), the reference's -1.5 and -1 (gap -0.5),
logits 0.75."""

import math

import pytest
import torch

from hydrappo.algo.preference import (
    LOSS_TYPES,
    PairLogps,
    implicit_rewards,
    pair_loss,
    preference_logits,
    preference_objective,
    sequence_logps,
)


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


PAIR = PairLogps(
    chosen=t(-2.0),
    rejected=t(-5.0),
    chosen_tokens=t(2.0),
    rejected_tokens=t(4.0),
    ref_chosen=t(-3.0),
    ref_rejected=t(-4.0),
)


def softplus(x):  # -log sigmoid(-x) = log(1 + e^x)
    return math.log1p(math.exp(x))


def test_logits_summed_and_length_averaged():
    assert preference_logits(PAIR, "sigmoid").item() == pytest.approx(2.0)
    assert preference_logits(PAIR, "ipo").item() == pytest.approx(0.75)
    assert preference_logits(PAIR, "simpo").item() == pytest.approx(0.25)  # no reference


def test_sigmoid_loss_by_hand():
    # -log sigmoid(0.1 * 2) = log(1 + e^-0.2) = 0.598138869...
    assert pair_loss(PAIR, "sigmoid", beta=0.1).item() == pytest.approx(0.5981388693, abs=1e-9)


def test_label_smoothing_cdpo_by_hand():
    # 0.9 * log(1 + e^-0.2) + 0.1 * log(1 + e^0.2)
    expected = 0.9 * softplus(-0.2) + 0.1 * softplus(0.2)
    assert expected == pytest.approx(0.6181388693, abs=1e-9)
    assert pair_loss(PAIR, "sigmoid", beta=0.1, label_smoothing=0.1).item() == pytest.approx(expected, abs=1e-12)


def test_robust_dpo_by_hand():
    # (0.9 * log(1 + e^-0.2) - 0.1 * log(1 + e^0.2)) / (1 - 0.2)
    expected = (0.9 * softplus(-0.2) - 0.1 * softplus(0.2)) / 0.8
    assert expected == pytest.approx(0.5731388693, abs=1e-9)
    assert pair_loss(PAIR, "robust", beta=0.1, label_smoothing=0.1).item() == pytest.approx(expected, abs=1e-12)
    # with no flipped labels it is DPO's
    assert pair_loss(PAIR, "robust", beta=0.1).item() == pytest.approx(pair_loss(PAIR, "sigmoid", beta=0.1).item())


def test_ipo_by_hand():
    # (0.75 - 1 / (2 * 0.1))^2 = (0.75 - 5)^2
    assert pair_loss(PAIR, "ipo", beta=0.1).item() == pytest.approx(18.0625)


def test_hinge_by_hand():
    assert pair_loss(PAIR, "hinge", beta=0.1).item() == pytest.approx(0.8)  # max(0, 1 - 0.2)
    assert pair_loss(PAIR, "hinge", beta=1.0).item() == 0.0  # the gap is past the margin


def test_simpo_by_hand():
    # beta 2, gamma 0.5: 2 * 0.25 - 0.5 = 0 -> log 2
    assert pair_loss(PAIR, "simpo", beta=2.0, simpo_gamma=0.5).item() == pytest.approx(math.log(2))
    # gamma 1: 2 * 0.25 - 1 = -0.5 -> log(1 + e^0.5)
    assert pair_loss(PAIR, "simpo", beta=2.0, simpo_gamma=1.0).item() == pytest.approx(softplus(0.5))


def test_simpo_needs_no_reference():
    no_reference = PairLogps(PAIR.chosen, PAIR.rejected, PAIR.chosen_tokens, PAIR.rejected_tokens)
    assert pair_loss(no_reference, "simpo", beta=2.0).item() == pytest.approx(pair_loss(PAIR, "simpo", beta=2.0).item())
    with pytest.raises(ValueError, match="reference"):
        pair_loss(no_reference, "sigmoid", beta=0.1)


def test_rpo_adds_the_chosen_answers_nll():
    loss, stats = preference_objective(PAIR, ("sigmoid", "sft"), (1.0, 0.5), beta=0.1)
    # DPO's 0.598... plus 0.5 x the chosen answer's token-mean NLL, 2 / 2 = 1
    assert loss.item() == pytest.approx(0.5981388693 + 0.5, abs=1e-9)
    assert stats["loss/sft"].item() == pytest.approx(1.0)
    assert stats["loss/sigmoid"].item() == pytest.approx(0.5981388693, abs=1e-9)


def test_trl_statistics_by_hand():
    pairs = PairLogps(
        chosen=t(-2.0, -6.0),
        rejected=t(-5.0, -4.0),
        chosen_tokens=t(2.0, 3.0),
        rejected_tokens=t(4.0, 2.0),
        ref_chosen=t(-3.0, -5.0),
        ref_rejected=t(-4.0, -4.0),
    )
    _, stats = preference_objective(pairs, beta=0.1)
    # rewards: chosen 0.1 * (1, -1), rejected 0.1 * (-1, 0)
    assert stats["rewards/chosen"].item() == pytest.approx(0.0)
    assert stats["rewards/rejected"].item() == pytest.approx(-0.05)
    assert stats["rewards/margins"].item() == pytest.approx(0.05)  # (0.2 + -0.1) / 2
    assert stats["rewards/accuracies"].item() == pytest.approx(0.5)
    assert stats["logps/chosen"].item() == pytest.approx(-4.0)
    assert stats["logps/rejected"].item() == pytest.approx(-4.5)
    chosen, rejected = implicit_rewards(pairs, "simpo", beta=2.0)  # beta x the mean log-prob
    assert chosen.tolist() == pytest.approx([-2.0, -4.0]) and rejected.tolist() == pytest.approx([-2.5, -4.0])


def test_a_tie_is_not_an_accurate_pair():
    tie = PairLogps(t(-2.0), t(-2.0), t(1.0), t(1.0), t(-2.0), t(-2.0))
    _, stats = preference_objective(tie, beta=0.1)
    assert stats["rewards/accuracies"].item() == 0.0


def test_sequence_logps_sums_the_answer_tokens():
    logprobs = t(-1.0, -2.0, -4.0).reshape(1, 3)
    mask = t(1.0, 1.0, 0.0).reshape(1, 3)
    total, count = sequence_logps(logprobs, mask)
    assert total.item() == -3.0 and count.item() == 2.0


def test_gradient_of_dpo_pushes_chosen_up_and_rejected_down():
    chosen, rejected = t(-2.0).requires_grad_(), t(-5.0).requires_grad_()
    logps = PairLogps(chosen, rejected, t(2.0), t(4.0), t(-3.0), t(-4.0))
    loss, _ = preference_objective(logps, beta=0.1)
    loss.backward()
    # d/dc -log sigmoid(beta (c - r - 1)) = -beta * sigmoid(-beta * logits)
    expected = -0.1 / (1 + math.exp(0.2))
    assert chosen.grad.item() == pytest.approx(expected) and rejected.grad.item() == pytest.approx(-expected)


def test_unknown_loss_and_weights_mismatch():
    with pytest.raises(ValueError, match="unknown loss_type"):
        pair_loss(PAIR, "kto", beta=0.1)
    with pytest.raises(ValueError, match="one weight each"):
        preference_objective(PAIR, ("sigmoid", "sft"), (1.0,))
    assert set(LOSS_TYPES) == {"sigmoid", "robust", "ipo", "hinge", "simpo", "sft"}
