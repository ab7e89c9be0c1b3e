"""A reward ensemble's math: K heads on one reward branch, each trained on its own bootstrap
resample of the pairs, and the one score PPO optimises from their K scores.

Coste et al. (2023), "Reward Model Ensembles Help Mitigate Overoptimization" (arXiv 2310.02743):
an ensemble whose members saw different resamples of the data disagrees where the data is thin,
and optimising a conservative combination (the worst member, or the mean less the spread) keeps
the policy from the regions where one member's errors are what pays. Here the members are heads
on one shared branch (Ahmed et al. 2024, "Scalable Ensembling for Mitigating Reward
Overoptimisation", arXiv 2406.01013): K linear maps cost nothing beside the branch's layers.
"""

from __future__ import annotations

import torch

ENSEMBLE_OBJECTIVES = ("mean", "worst", "mean_minus_std")


def bootstrap_counts(pairs: int, heads: int, seed: int) -> torch.Tensor:
    """(pairs, heads) float counts: how often each head sees each pair in its bootstrap resample.

    Poisson(1) counts, the online bootstrap of Oza & Russell (2001, "Online Bagging and
    Boosting"): as the number of pairs grows, a Poisson(1) count is the count of a pair in a
    resample of n pairs drawn with replacement (Binomial(n, 1/n)), and each pair's count is drawn
    on its own, so a batch needs no resample of the whole set. Drawn once from `seed`: a resumed
    run and every process see the same counts. One head is the plain data (all counts 1)."""
    if heads == 1:
        return torch.ones(pairs, 1)
    generator = torch.Generator().manual_seed(seed)
    return torch.poisson(torch.ones(pairs, heads), generator=generator)


def ensemble_score(scores: torch.Tensor, objective: str = "mean", std_weight: float = 1.0) -> torch.Tensor:
    """(B,) score of (B, K) head scores under `objective` (Coste et al. 2023, section 3):

    - ``mean``: the mean of the heads (their "mean optimisation").
    - ``worst``: the lowest head's score ("worst-case optimisation", WCO).
    - ``mean_minus_std``: mean - std_weight * std over the heads (population std, 1/K), the
      uncertainty-weighted objective (UWO) with the spread in the scores' own units rather than
      the paper's variance, so that std_weight does not depend on the scores' scale.

    (B,) scores (one head) are returned as they are."""
    if scores.dim() == 1:
        return scores
    if objective == "mean":
        return scores.mean(-1)
    if objective == "worst":
        return scores.min(-1).values
    if objective == "mean_minus_std":
        return scores.mean(-1) - std_weight * scores.std(-1, correction=0)
    raise ValueError(f"unknown ensemble objective {objective!r}; the known ones: {', '.join(ENSEMBLE_OBJECTIVES)}")
