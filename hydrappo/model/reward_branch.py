"""The reward branch: a frozen (or, in the reward stage, training) reward model that sits on the hydra's trunk.

Its own copy of the layers from the split up, optionally its own final norm, and a scalar head (model/heads.py)
read at a pooled hidden state. The hydra runs the layers (HydraModel.reward_scores); the pooling is here.
"""

from __future__ import annotations

import torch
from torch import nn

from .heads import RewardHead
from .split import last_token_index

REWARD_POOLINGS = ("last", "mean")


class RewardBranch(nn.Module):
    """A frozen reward model on the trunk: its own top layers (optionally its own final
    norm) and a scalar head read at the pooled hidden state: `pooling="last"` the last
    non-padding token, `"mean"` the mean of the response tokens' hidden states."""

    def __init__(self, layers: nn.ModuleList, head: RewardHead, norm: nn.Module | None = None, pooling: str = "last"):
        super().__init__()
        self.layers = layers
        self.norm = norm
        self.head = head
        self.pooling = pooling


def pooled_scores(branch: RewardBranch, hidden: torch.Tensor, attention_mask: torch.Tensor, response_start=None):
    """The branch's head on its final hidden states (B, T, H), pooled as `branch.pooling` says.

    `"last"` reads the last non-padding token; `"mean"` the mean over the non-padding tokens in
    columns `response_start:` (prompts left-padded to `response_start` columns, as
    data.pack_sequences packs them)."""
    if branch.pooling == "mean":
        if response_start is None:
            raise ValueError("mean pooling needs response_start, the column where the responses begin.")
        weights = attention_mask.to(hidden.dtype).clone()
        weights[:, :response_start] = 0
        return branch.head((hidden * weights.unsqueeze(-1)).sum(1) / weights.sum(-1, keepdim=True).clamp(min=1))
    last = last_token_index(attention_mask)
    return branch.head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
