"""Scalar heads that sit on the trunk's final hidden state."""

from __future__ import annotations

import torch
from torch import nn

VALUE_HEAD_INITS = ("random", "reward_head")


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in at least float32: bf16/fp16 become float32, float64 stays float64."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


class ValueHead(nn.Module):
    """The critic: MLP hidden -> 2*hidden -> 1 with ReLU.

    Kept in at least float32 whatever the trunk's dtype (float64 with a float64
    trunk, see HydraModel): value targets are returns of
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
        return self.mlp(hidden.to(self.mlp[0].weight.dtype)).squeeze(-1)

    @torch.no_grad()
    def init_from_reward_head(self, head: RewardHead) -> None:
        """Make V(h) = w.h + b exactly, with w, b the reward head's Linear(h, 1) (of K heads: the
        linear map of their mean score, RewardHead.mean_linear).

        What is copied: the first layer becomes [I; -I] with zero bias, so its 2h outputs
        after ReLU are (relu(h), relu(-h)); the last layer becomes [w, -w] with the reward
        head's bias b, so V(h) = w.relu(h) - w.relu(-h) + b = w.h + b. Needs expansion 2.
        The value head reads the POLICY's final hidden state, the reward head the reward
        branch's: V equals the reward score (before any normalisation) only where the two
        hidden states are equal, i.e. while the policy's top layers still equal the branch's
        (a branch trained from the same trunk moves its layers, so in general V starts as
        the reward head's linear map on the policy's features, not as the reward itself)."""
        first, last = self.mlp[0], self.mlp[2]
        h = self.hidden_size
        if first.out_features != 2 * h or head.score.in_features != h:
            raise ValueError(
                "value_head_init=reward_head needs a value head of expansion 2 on the reward head's hidden size."
            )
        eye = torch.eye(h, dtype=first.weight.dtype, device=first.weight.device)
        first.weight.copy_(torch.cat([eye, -eye]))
        first.bias.zero_()
        w, b = head.mean_linear()
        w = w.to(last.weight)
        last.weight.copy_(torch.cat([w, -w], dim=1))
        last.bias.copy_(b.to(last.bias))


class RewardHead(nn.Module):
    """The reward model's scalar head: one linear map of the pooled hidden state, or K of them
    (`heads`), the members of a reward ensemble on one branch (algo/ensemble.py).

    One head answers (B,) scores, K heads (B, K). The K maps are one Linear(h, K) named `score`,
    so one head keeps the weight names of checkpoints written before ensembles. A Bradley-Terry
    head is fixed only up to a shift, so heads trained on different resamples sit at different
    offsets: K heads answer each score standardised by its head's reference statistics
    (`standardise`, set when the reward stage ends), which makes their spread and their worst
    member mean something. One head answers its raw score, as it always did."""

    def __init__(self, hidden_size: int, heads: int = 1):
        super().__init__()
        self.hidden_size = hidden_size
        self.heads = heads
        self.score = nn.Linear(hidden_size, heads)
        self.register_buffer("center", torch.zeros(heads), persistent=False)
        self.register_buffer("scale", torch.ones(heads), persistent=False)
        self.float()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = self.score(hidden.to(self.score.weight.dtype))
        if self.heads == 1:
            return scores.squeeze(-1)
        return (scores - self.center.to(scores)) / self.scale.to(scores)

    @torch.no_grad()
    def standardise(self, mean, std) -> None:
        """Answer (score - mean) / std per head from now on (K heads; one head stays raw)."""
        if self.heads > 1:
            self.center.copy_(torch.as_tensor(mean, dtype=self.center.dtype))
            self.scale.copy_(torch.as_tensor(std, dtype=self.scale.dtype))

    @torch.no_grad()
    def mean_linear(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w, b) with w.h + b the mean of the heads' (standardised) scores: a linear map, since each
        head's is. One head: its own weight (1, h) and bias (1,)."""
        weight, bias = self.score.weight, self.score.bias
        if self.heads == 1:
            return weight, bias
        scale, center = self.scale.to(weight), self.center.to(weight)
        return (weight / scale[:, None]).mean(0, keepdim=True), ((bias - center) / scale).mean(0, keepdim=True)
