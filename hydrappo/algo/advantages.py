"""Advantages: how much better than expected each response token turned out.

Per-token tensors are response-aligned, (B, R), with ``action_mask`` marking real tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import Problem
from .masked import bool_mask, check_same_shape, masked, whiten, widened


def gae(
    rewards: torch.Tensor, values: torch.Tensor, action_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), per row of a padded batch.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t            (the value targets, "returns")

    Each row is one episode that ends after its last response token, so V and A after it
    are 0 (no bootstrap). Rewards and values at masked positions are set to 0 first and the
    recursion restarts at every masked position, so padding never leaks in. This is exact
    for right-padded rows (real tokens contiguous from t = 0) and for left padding; a mask
    with holes would be read as several episodes, one per run of real tokens.

    Returns ``(advantages, returns)``, detached (they are targets), 0 at masked positions.
    """
    check_same_shape(rewards=rewards, values=values, action_mask=action_mask)
    mask = bool_mask(action_mask)
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    rewards, values = masked(rewards.detach(), mask).to(dtype), masked(values.detach(), mask).to(dtype)
    length = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    next_advantage = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t + 1 < length else torch.zeros_like(next_advantage)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = torch.where(mask[:, t], delta + gamma * lam * next_advantage, 0.0)
        advantages[:, t] = next_advantage
    returns = masked(advantages + values, mask)
    return advantages, returns


# ---------------------------------------------------------------------------- critic-free estimators
def group_size_problem(estimator: str, group_size: int) -> Problem | None:
    """An estimator that compares the responses to one prompt needs two or more of them: the
    config checks report this, the group baselines raise it."""
    if group_size >= 2 or not ESTIMATORS[estimator].needs_groups:
        return None
    return Problem(
        "ppo.advantage_estimator",
        estimator,
        f"compares the responses to one prompt with each other, but generation.samples_per_prompt is {group_size}",
        "set generation.samples_per_prompt >= 2 (e.g. 4 or 8)",
    )


def _groups(scores: torch.Tensor, group_size: int, estimator: str) -> torch.Tensor:
    """(B,) sequence scores -> (B / G, G): the G samples of a prompt are consecutive rows."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be (batch,), got shape {tuple(scores.shape)}")
    if (problem := group_size_problem(estimator, group_size)) is not None:
        raise ValueError(str(problem))
    if scores.shape[0] % group_size:
        raise ValueError(f"{scores.shape[0]} scores do not split into groups of {group_size}")
    return scores.reshape(-1, group_size)


def grpo_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's outcome advantage (Shao et al. 2024, DeepSeekMath, eq. in section 4.1.2):

        A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

    with the unbiased standard deviation over the G samples of the same prompt (as the
    reference implementations do). A group whose rewards are all equal gets A = 0 (no signal,
    no nan). Returns (B,)."""
    groups = _groups(widened(scores), group_size, "grpo")
    centred = groups - groups.mean(-1, keepdim=True)
    return (centred / (groups.std(-1, keepdim=True) + eps)).reshape(-1)


def dr_grpo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): GRPO without the
    division by the group's standard deviation, which over-weights prompts that are nearly
    always or never solved: A_i = r_i - mean(r_group). Pair it with loss_agg_mode
    seq-mean-token-sum, their fix of the length bias. Returns (B,)."""
    groups = _groups(widened(scores), group_size, "dr_grpo")
    return (groups - groups.mean(-1, keepdim=True)).reshape(-1)


def rloo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics"):
    the baseline of each sample is the mean reward of the OTHER G - 1 samples of its prompt,

        A_i = r_i - 1/(G-1) sum_{j != i} r_j = G/(G-1) (r_i - mean(r_group)),

    an unbiased baseline (it does not depend on the sample itself). Returns (B,)."""
    groups = _groups(widened(scores), group_size, "rloo")
    return (group_size / (group_size - 1) * (groups - groups.mean(-1, keepdim=True))).reshape(-1)


def group_mean_baseline(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """r_i - mean(r_group): REINFORCE++-baseline's first step (Hu 2025). Returns (B,)."""
    return dr_grpo_advantages(scores, group_size)


def reinforce_pp_advantages(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): the discounted return of each token of the shaped per-token
    rewards (the KL penalty on every token, the score on the last), G_t = sum_{s>=t}
    gamma^(s-t) r_s, normalised over the whole batch (mean 0, std 1 over the real tokens)
    instead of by a critic or a per-prompt group. The return is `gae` with no values and
    lambda = 1. Returns (B, R), 0 at masked positions."""
    returns, _ = gae(rewards, torch.zeros_like(rewards), action_mask, gamma, 1.0)
    return whiten(returns, action_mask)


def sequence_advantages(advantages: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """A per-sequence advantage (B,) on every real token of its response (B, R)."""
    return masked(advantages[:, None].expand(action_mask.shape), action_mask)


def _gae_estimate(rewards, values, action_mask, group_size, gamma, lam, whiten_advantages):
    if values is None:
        raise ValueError("the gae estimator needs the critic's values")
    advantages, returns = gae(rewards, values, action_mask, gamma, lam)
    return (whiten(advantages, action_mask) if whiten_advantages else advantages), returns


def _reinforce_pp_estimate(rewards, values, action_mask, group_size, gamma, lam, whiten_advantages):
    return reinforce_pp_advantages(rewards, action_mask, gamma), None


def _per_sequence(baseline):
    """An estimator from a group baseline of each response's total reward (its score plus the KL
    penalty summed over its tokens, as verl folds KL-in-reward into the outcome), put on every
    token of the response. No critic, no returns."""

    def estimate(rewards, values, action_mask, group_size, gamma, lam, whiten_advantages):
        totals = masked(rewards, action_mask).sum(-1)
        return sequence_advantages(baseline(totals, group_size), action_mask), None

    return estimate


@dataclass(frozen=True)
class Estimator:
    """One advantage estimator and what the rest of the trainer needs to know about it (the
    config checks, which heads are built, how scores are shaped): adding one is a function and
    a row of ESTIMATORS."""

    name: str
    estimate: Callable  # (rewards, values, action_mask, group_size, gamma, lam, whiten) -> (advantages, returns)
    needs_critic: bool = False  # a value head is built and trained (and returns are computed)
    needs_groups: bool = False  # several samples per prompt (generation.samples_per_prompt >= 2)
    baseline_on_scores: bool = False  # the group mean is subtracted from the scores before shaping


ESTIMATORS = {
    e.name: e
    for e in (
        Estimator("gae", _gae_estimate, needs_critic=True),
        Estimator("grpo", _per_sequence(grpo_advantages), needs_groups=True),
        Estimator("dr_grpo", _per_sequence(dr_grpo_advantages), needs_groups=True),
        Estimator("rloo", _per_sequence(rloo_advantages), needs_groups=True),
        Estimator("reinforce_pp", _reinforce_pp_estimate),
        Estimator("reinforce_pp_baseline", _reinforce_pp_estimate, needs_groups=True, baseline_on_scores=True),
    )
}
ADVANTAGE_ESTIMATORS = tuple(ESTIMATORS)


def estimate_advantages(
    estimator: str,
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    action_mask: torch.Tensor,
    *,
    group_size: int = 1,
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten_advantages: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages (B, R), returns (B, R) or None) of shaped per-token rewards, by estimator:

    - ``gae``: GAE with the critic's values; whitened over the batch if asked (PPO).
    - ``grpo`` / ``dr_grpo`` / ``rloo``: the group baseline of each response's total reward
      (its score plus the KL penalty summed over its tokens, as verl folds KL-in-reward into
      the outcome), on every token of the response. No critic, no returns.
    - ``reinforce_pp`` / ``reinforce_pp_baseline``: token returns normalised over the batch
      (the baseline variant's group mean was subtracted from the scores before shaping, see
      ``shape_rewards(group_baseline=G)``).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
    return ESTIMATORS[estimator].estimate(rewards, values, action_mask, group_size, gamma, lam, whiten_advantages)
