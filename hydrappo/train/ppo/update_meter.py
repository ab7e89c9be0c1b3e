"""The statistics of one PPO update, gathered over its minibatches, micro-batches and processes."""

from __future__ import annotations

import math

from ...algo.masked import explained_variance_of_parts
from ..run_log import as_float

EXPLAINED_VARIANCE_PARTS = ("val/_returns", "val/_returns_sq", "val/_residual", "val/_residual_sq")


class UpdateMeter:
    """The statistics of one update, the same however its minibatches were split (micro-batches,
    processes): a `loss/*` value is one part's share of its minibatch's loss, so the parts add
    up and the minibatches are averaged; a `*_max` is a maximum; any other statistic is its
    part's masked token mean, weighted by the part's tokens; the explained variance is that of
    every token of the update, from its parts (algo.masked.explained_variance_parts). A value
    that is not finite is left out rather than poisoning the mean."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.maxima: dict[str, float] = {}
        self.grad_norms: list[float] = []

    def add(self, stats: dict, tokens: float) -> None:
        for key, value in stats.items():
            value = as_float(value)
            if not math.isfinite(value):
                continue
            if key.endswith("_max"):
                self.maxima[key] = max(self.maxima.get(key, value), value)
                continue
            weight = 1.0 if key.startswith("loss/") else tokens
            self.sums[key] = self.sums.get(key, 0.0) + value * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def mark(self) -> tuple:
        """What has been added so far; `rewind(mark)` drops whatever was added after it (a minibatch
        that starts again after running out of memory)."""
        return dict(self.sums), dict(self.weights), dict(self.maxima)

    def rewind(self, mark: tuple) -> None:
        self.sums, self.weights, self.maxima = (dict(part) for part in mark)

    def means(self, dist, minibatches: int, prefix: str = "") -> dict:
        sums, weights, maxima = {}, {}, {}
        for part_sums, part_weights, part_maxima in dist.gather_objects((self.sums, self.weights, self.maxima)):
            for key, value in part_sums.items():
                sums[key] = sums.get(key, 0.0) + value
                weights[key] = weights.get(key, 0.0) + part_weights[key]
            for key, value in part_maxima.items():
                maxima[key] = max(maxima.get(key, value), value)
        out = {
            f"{prefix}{key}": total / (minibatches if key.startswith("loss/") else weights[key])
            for key, total in sums.items()
            if key.startswith("loss/") or weights[key] > 0
        }
        out.update({f"{prefix}{key}": value for key, value in maxima.items()})
        if all(f"{prefix}{key}" in out for key in EXPLAINED_VARIANCE_PARTS):
            parts = [out.pop(f"{prefix}{key}") for key in EXPLAINED_VARIANCE_PARTS]
            out[f"{prefix}val/var_explained"] = explained_variance_of_parts(*parts)
        if self.grad_norms:  # the same on every process: the norm of the summed gradients
            out[f"{prefix}grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
        return out
