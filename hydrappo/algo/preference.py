"""Direct preference optimisation and its family: losses of a policy's log-probabilities of a
chosen and a rejected answer to the same prompt, with no reward model.

Every loss reads per-pair (B,) sequence log-probs, the sum over an answer's tokens of
log pi(token | before), of the policy and (except SimPO) of the reference, and the answers'
token counts. TRL's names: `beta`, `loss_type` (`sigmoid`, `robust`, `ipo`, `hinge`, `simpo`,
and `sft` combined with another through `loss_weights`), `label_smoothing`, `simpo_gamma`.

The implicit reward of an answer y (Rafailov et al. 2023, section 5) is
    r(y) = beta * (log pi(y | x) - log pi_ref(y | x)),
so the chosen answer wins when the policy raised it above the reference more than the rejected
one; SimPO's is beta times the policy's length-averaged log-prob, with no reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .masked import widened

# The losses one pair of answers gives; `sft` is the chosen answer's NLL, a term to add (RPO).
PAIR_LOSSES = ("sigmoid", "robust", "ipo", "hinge", "simpo")
LOSS_TYPES = (*PAIR_LOSSES, "sft")
# The losses that read a reference's log-probs (SimPO and SFT do not).
NEEDS_REFERENCE = ("sigmoid", "robust", "ipo", "hinge")
# The losses that compare length-averaged log-probs instead of sums: IPO as TRL computes it
# (its trainer divides by the answer's length for `ipo`), SimPO by its definition.
LENGTH_AVERAGED = ("ipo", "simpo")


@dataclass(frozen=True)
class PairLogps:
    """Per-pair (B,) summed log-probs of the chosen and the rejected answer and their token
    counts; `ref_*` None when no reference ran."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor
    ref_chosen: torch.Tensor | None = None
    ref_rejected: torch.Tensor | None = None


def sequence_logps(logprobs: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over each row's answer tokens of the (B, R) per-token log-probs, the row's token count)."""
    mask = action_mask.to(logprobs.dtype)
    return (widened(logprobs) * mask).sum(-1), mask.sum(-1)


def dpo_sigmoid_loss(logits: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """(B,) DPO loss of Rafailov et al. (2023), eq. 7: -log sigmoid(beta * logits), where logits is
    (log pi(y_c) - log pi(y_r)) - (log pi_ref(y_c) - log pi_ref(y_r)). With label_smoothing e > 0,
    conservative DPO (cDPO, Mitchell 2023): the label is flipped with probability e, so the loss is
    the expectation (1 - e) * -log sigmoid(beta * logits) + e * -log sigmoid(-beta * logits)."""
    scaled = beta * logits
    return -(1 - label_smoothing) * F.logsigmoid(scaled) - label_smoothing * F.logsigmoid(-scaled)


def dpo_robust_loss(logits: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """(B,) robust DPO of Chowdhury et al. (2024, "Provably Robust DPO", eq. 8): an unbiased loss
    under labels flipped with a known probability e < 1/2,
    ((1 - e) * -log sigmoid(beta * logits) - e * -log sigmoid(-beta * logits)) / (1 - 2e)."""
    scaled = beta * logits
    return (-(1 - label_smoothing) * F.logsigmoid(scaled) + label_smoothing * F.logsigmoid(-scaled)) / (
        1 - 2 * label_smoothing
    )


def ipo_loss(logits: torch.Tensor, beta: float) -> torch.Tensor:
    """(B,) IPO of Azar et al. (2023, "A General Theoretical Paradigm...", eq. 17): the squared
    distance of the log-ratio gap from 1 / (2 tau), tau being TRL's beta: (logits - 1/(2 beta))^2.
    A squared loss stops pushing once the gap is reached, where DPO's keeps pushing."""
    return (logits - 1 / (2 * beta)) ** 2


def hinge_loss(logits: torch.Tensor, beta: float) -> torch.Tensor:
    """(B,) SLiC's calibration loss of Zhao et al. (2023, "SLiC-HF", eq. 1) on the log-ratio gap:
    max(0, 1 - beta * logits); TRL's `hinge`."""
    return torch.relu(1 - beta * logits)


def simpo_loss(
    chosen_mean_logp: torch.Tensor,
    rejected_mean_logp: torch.Tensor,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """(B,) SimPO of Meng et al. (2024, eq. 6): reference-free, on the length-averaged log-probs,
    with a target margin gamma: -log sigmoid(beta * (mean logp_c - mean logp_r) - gamma), written as
    TRL's CPO trainer does, beta * (gap - gamma / beta), and with its label smoothing."""
    logits = (chosen_mean_logp - rejected_mean_logp) - gamma / beta
    return dpo_sigmoid_loss(logits, beta, label_smoothing)


def preference_logits(logps: PairLogps, loss_type: str) -> torch.Tensor:
    """(B,) the quantity a pair loss reads: the policy's log-ratio gap minus the reference's
    (summed log-probs, or length-averaged for LENGTH_AVERAGED losses); SimPO's has no reference."""
    chosen, rejected = answer_logps(logps, loss_type)
    gap = chosen - rejected
    if loss_type not in NEEDS_REFERENCE:
        return gap
    ref_chosen, ref_rejected = answer_logps(logps, loss_type, reference=True)
    return gap - (ref_chosen - ref_rejected)


def answer_logps(logps: PairLogps, loss_type: str, reference: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) log-probs of the policy (or the reference) as `loss_type` compares them."""
    chosen, rejected = (logps.ref_chosen, logps.ref_rejected) if reference else (logps.chosen, logps.rejected)
    if chosen is None:
        raise ValueError(f"loss_type {loss_type!r} needs the reference's log-probs; none were given.")
    if loss_type in LENGTH_AVERAGED:
        return chosen / logps.chosen_tokens.clamp(min=1), rejected / logps.rejected_tokens.clamp(min=1)
    return chosen, rejected


def pair_loss(
    logps: PairLogps, loss_type: str, beta: float, label_smoothing: float = 0.0, simpo_gamma: float = 0.5
) -> torch.Tensor:
    """(B,) the loss `loss_type` (one of PAIR_LOSSES) of each pair."""
    if loss_type == "simpo":
        chosen, rejected = answer_logps(logps, "simpo")
        return simpo_loss(chosen, rejected, beta, simpo_gamma, label_smoothing)
    logits = preference_logits(logps, loss_type)
    if loss_type == "sigmoid":
        return dpo_sigmoid_loss(logits, beta, label_smoothing)
    if loss_type == "robust":
        return dpo_robust_loss(logits, beta, label_smoothing)
    if loss_type == "ipo":
        return ipo_loss(logits, beta)
    if loss_type == "hinge":
        return hinge_loss(logits, beta)
    raise ValueError(f"unknown loss_type {loss_type!r}; choose from {', '.join(LOSS_TYPES)}.")


def implicit_rewards(logps: PairLogps, loss_type: str, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) implicit rewards of the chosen and the rejected answer: beta * (policy - reference)
    log-probs (Rafailov et al. 2023), or beta * the policy's alone for a reference-free loss; as
    the loss compares them (summed, or length-averaged). What TRL logs as rewards/chosen and
    rewards/rejected."""
    kind = loss_type if loss_type in PAIR_LOSSES else "sigmoid"
    chosen, rejected = answer_logps(logps, kind)
    if kind in NEEDS_REFERENCE and logps.ref_chosen is not None:
        ref_chosen, ref_rejected = answer_logps(logps, kind, reference=True)
        chosen, rejected = chosen - ref_chosen, rejected - ref_rejected
    return beta * chosen, beta * rejected


def preference_objective(
    logps: PairLogps,
    loss_types: tuple[str, ...] = ("sigmoid",),
    loss_weights: tuple[float, ...] | None = None,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
) -> tuple[torch.Tensor, dict]:
    """The batch's loss, sum_k w_k * mean loss_k, and TRL's statistics. `sft` is the chosen answers'
    token-mean negative log-likelihood (RPO, Pang et al. 2024: DPO plus the chosen answer's NLL,
    weighted by alpha; TRL's `loss_type: [sigmoid, sft]` with `loss_weights: [1, alpha]`).

    Stats: rewards/chosen, rewards/rejected (mean implicit rewards), rewards/accuracies (the share of
    pairs whose chosen reward is the larger; a tie counts as a miss, as in TRL), rewards/margins
    (mean chosen - rejected reward), logps/chosen, logps/rejected (mean summed log-probs), and
    loss/<type> for each term of a combined loss."""
    weights = tuple(loss_weights) if loss_weights is not None else (1.0,) * len(loss_types)
    if len(weights) != len(loss_types):
        raise ValueError(f"{len(loss_types)} loss types but {len(weights)} loss weights; give one weight each.")
    terms = {}
    for loss_type in loss_types:
        if loss_type == "sft":
            terms[loss_type] = -logps.chosen.sum() / logps.chosen_tokens.sum().clamp(min=1)
        else:
            terms[loss_type] = pair_loss(logps, loss_type, beta, label_smoothing, simpo_gamma).mean()
    loss = sum(weight * terms[kind] for kind, weight in zip(loss_types, weights))
    with torch.no_grad():
        reward_kind = next((kind for kind in loss_types if kind != "sft"), "sigmoid")
        chosen_reward, rejected_reward = implicit_rewards(logps, reward_kind, beta)
        stats = {
            "loss": loss.detach(),
            "rewards/chosen": chosen_reward.mean(),
            "rewards/rejected": rejected_reward.mean(),
            "rewards/accuracies": (chosen_reward > rejected_reward).float().mean(),
            "rewards/margins": (chosen_reward - rejected_reward).mean(),
            "logps/chosen": logps.chosen.detach().mean(),
            "logps/rejected": logps.rejected.detach().mean(),
        }
        if len(loss_types) > 1:
            stats.update({f"loss/{kind}": value.detach() for kind, value in terms.items()})
    return loss, stats
