"""Scalar heads that sit on the trunk's final hidden state."""

from __future__ import annotations

import torch
from torch import nn


class ValueHead(nn.Module):
    """The critic: MLP hidden -> 2*hidden -> 1 with ReLU.

    Kept in float32 whatever the trunk's dtype: value targets are returns of
    arbitrary scale and a bf16 regression head loses them (trlX and TRL do the same).
    """

    def __init__(self, hidden_size: int, expansion: int = 2):
        super().__init__()
        self.hidden_size = hidden_size
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size, expansion * hidden_size),
            nn.ReLU(),
            nn.Linear(expansion * hidden_size, 1),
        )
        self.float()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(hidden.float()).squeeze(-1)


class RewardHead(nn.Module):
    """The reward model's scalar head: one linear map of the last token's hidden state."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.score = nn.Linear(hidden_size, 1)
        self.float()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.score(hidden.float()).squeeze(-1)
