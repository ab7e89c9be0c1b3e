"""algo/masked.py: masked statistics, whitening and explained variance, by hand."""

import math
import statistics

import torch

from hydrappo.algo.masked import explained_variance, last_true_index, masked_mean, masked_sum, masked_var, whiten

from tensors import close

# ---------------------------------------------------------------------------- masked statistics
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, math.nan]])
M = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)


def test_masked_sum_mean_var_by_hand():
    close(masked_sum(X, M), 1.0 + 2.0 + 3.0 + 4.0)
    close(masked_sum(X, M, dim=-1), [1.0 + 2.0 + 3.0, 4.0])
    close(masked_mean(X, M), (1.0 + 2.0 + 3.0 + 4.0) / 4)
    close(masked_mean(X, M, dim=-1), [(1.0 + 2.0 + 3.0) / 3, 4.0 / 1])
    squares = (1 - 2.5) ** 2 + (2 - 2.5) ** 2 + (3 - 2.5) ** 2 + (4 - 2.5) ** 2
    close(masked_var(X, M), squares / (4 - 1))
    close(masked_var(X, M, unbiased=False), squares / 4)
    close(masked_var(X, M), statistics.variance([1.0, 2.0, 3.0, 4.0]))


def test_float_and_bool_masks_agree():
    for fn in (masked_sum, masked_mean, masked_var, whiten):
        close(fn(X, M.float()), fn(X, M))


def test_empty_selections_give_zero_not_nan():
    empty = torch.zeros_like(M)
    assert masked_mean(X, empty).item() == 0.0
    close(masked_mean(X, torch.tensor([[1, 0, 0], [0, 0, 0]]), dim=-1), [1.0, 0.0])
    # One token: no unbiased variance, and it whitens to 0.
    one = torch.tensor([[0, 1, 0], [0, 0, 0]])
    assert masked_var(X, one).item() == 0.0
    assert torch.all(whiten(X, one) == 0)


def test_whiten_by_hand():
    mean, var = 2.5, statistics.variance([1.0, 2.0, 3.0, 4.0])
    expected = torch.tensor(
        [[(v - mean) / math.sqrt(var + 1e-8) for v in (1.0, 2.0, 3.0)], [(4.0 - mean) / math.sqrt(var + 1e-8), 0, 0]]
    )
    close(whiten(X, M), expected)
    # shift_mean=False adds the mean back (lm-human-preferences), still 0 on padding.
    close(whiten(X, M, shift_mean=False), (expected + mean) * M)


def test_explained_variance_by_hand():
    values = torch.tensor([[1.0, 1.0, 0.5, -0.1, 7.0]])
    returns = torch.tensor([[0.0, 2.0, 1.0, 0.0, math.nan]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    residual = [0.0 - 1.0, 2.0 - 1.0, 1.0 - 0.5, 0.0 - -0.1]
    expected = 1 - statistics.pvariance(residual) / statistics.pvariance([0.0, 2.0, 1.0, 0.0])
    close(explained_variance(values, returns, mask), expected)
    close(explained_variance(returns, returns, mask), 1.0)
    assert math.isnan(explained_variance(values, torch.ones_like(returns), mask).item())


def test_last_true_index():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert last_true_index(mask).tolist() == [2, 2, -1, 3]
