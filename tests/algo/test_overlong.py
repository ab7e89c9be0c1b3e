"""DAPO's soft overlong penalty and overlong filtering (algo/scores.py) on hand numbers."""

import pytest
import torch

from hydrappo.algo.scores import overlong_filter, overlong_penalty


def test_soft_overlong_penalty_by_hand():
    # L_max = 32, L_cache = 8: free up to 24 tokens, then (24 - |y|) / 8, -1 at 32.
    lengths = torch.tensor([5, 24, 25, 28, 31, 32], dtype=torch.float64)
    expected = torch.tensor([0.0, 0.0, -0.125, -0.5, -0.875, -1.0], dtype=torch.float64)
    assert torch.equal(overlong_penalty(lengths, 32, 8), expected)
    assert torch.equal(overlong_penalty(lengths, 32, 8, factor=0.5), expected * 0.5)
    assert torch.equal(overlong_penalty(torch.tensor([32, 3]), 32, 0), torch.zeros(2))  # off
    assert torch.equal(overlong_penalty(torch.tensor([32, 31]), 32, 32), torch.tensor([-1.0, -31 / 32]))
    with pytest.raises(ValueError, match="overlong buffer"):
        overlong_penalty(lengths, 32, 33)


def test_overlong_filter_drops_truncated_rows_only():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    ended = torch.tensor([True, False, True])
    assert torch.equal(overlong_filter(mask, ended), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
