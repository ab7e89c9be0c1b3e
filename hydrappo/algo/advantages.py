"""Advantages: how much better than expected each response token turned out.

Per-token tensors are response-aligned, (B, R), with ``action_mask`` marking real tokens.
"""

from __future__ import annotations

import torch

from .masked import bool_mask, check_same_shape, masked


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
