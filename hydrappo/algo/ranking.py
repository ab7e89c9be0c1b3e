"""Ranking layers by a measured gain, and how alike two rankings are: the pure half of the one-layer
sweep (train/layer_sweep.py), which trains each layer alone for a few steps and ranks the layers
by their held-out gain per step (Zhang et al. 2026, "Is One Layer Enough?", arXiv 2607.01232).

Every function takes plain numbers ({layer index: gain}) and returns plain numbers; none reads a
file or a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def rank_layers(gains: Mapping[int, float]) -> list[int]:
    """The layers from the largest gain down; equal gains in layer order (the lower first)."""
    return sorted(gains, key=lambda layer: (-gains[layer], layer))


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n of `values` in ascending order, tied values sharing the mean of the ranks they
    span: [0.3, 0.1, 0.3] -> [2.5, 1.0, 2.5] (the "fractional ranking" Spearman's rho uses with ties)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        shared = (start + end) / 2 + 1  # the mean of ranks start+1 .. end+1
        for position in range(start, end + 1):
            ranks[order[position]] = shared
        start = end + 1
    return ranks


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation of two measurements of the same items (x[i] and y[i] measure
    item i): Pearson's correlation of their ranks, ties given their average rank (Spearman 1904,
    "The proof and measurement of association between two things", Am. J. Psychol. 15(1):72-101).
    Without ties it equals 1 - 6 sum(d_i^2) / (n (n^2 - 1)), d_i the difference of item i's two ranks.

    1: the same order; -1: the reverse; NaN when it is undefined (fewer than two items, or one
    measurement the same for every item, which orders nothing)."""
    if len(x) != len(y):
        raise ValueError(f"spearman_rho: {len(x)} values against {len(y)}; give one pair per item.")
    if len(x) < 2:
        return math.nan
    rx, ry = average_ranks(x), average_ranks(y)
    mean = (len(x) + 1) / 2  # the mean of ranks 1..n, ties or not
    covariance = sum((a - mean) * (b - mean) for a, b in zip(rx, ry))
    spread_x = sum((a - mean) ** 2 for a in rx)
    spread_y = sum((b - mean) ** 2 for b in ry)
    if spread_x == 0 or spread_y == 0:
        return math.nan
    return covariance / math.sqrt(spread_x * spread_y)


def best_window(gains: Mapping[int, float], width: int) -> tuple[int, int, float]:
    """(start, end, summed gain) of the `width` consecutive layers start..end-1, every one of them
    measured, whose gains sum to the most. Equal sums go to the higher window: a band's update
    backpropagates from its bottom layer to the top, so a higher band costs less. Raises ValueError
    when no `width` consecutive layers were measured."""
    if width < 1:
        raise ValueError(f"a window of {width} layers: give 1 or more.")
    best = None
    for start in sorted(gains):
        window = range(start, start + width)
        if all(layer in gains for layer in window):
            total = math.fsum(gains[layer] for layer in window)
            if best is None or total >= best[2]:
                best = (start, start + width, total)
    if best is None:
        raise ValueError(f"no {width} consecutive layers were measured (measured: {sorted(gains)}).")
    return best
