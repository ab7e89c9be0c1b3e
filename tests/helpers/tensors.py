"""Small tensors for the math's tests: a comparison, a right-padding with garbage, masks from
lengths."""

from __future__ import annotations

import math

import torch

GARBAGE = [math.nan, math.inf, -math.inf, 1e30]  # what padding may hold: the mask must keep it out


def close(actual, expected, **kwargs):
    """torch.testing.assert_close in float32 (its tolerances unless given)."""
    torch.testing.assert_close(torch.as_tensor(actual).float(), torch.as_tensor(expected).float(), **kwargs)


def pad(x, extra, fill=GARBAGE):
    """Append `extra` columns; garbage for data, 0 for masks."""
    if x.dtype == torch.bool or fill == 0:
        return torch.cat([x, torch.zeros(x.shape[0], extra, dtype=x.dtype)], dim=1)
    cols = torch.tensor([fill[i % len(fill)] for i in range(extra)], dtype=x.dtype)
    return torch.cat([x.detach(), cols.expand(x.shape[0], extra)], dim=1)


def mask_from_lengths(lengths, width, dtype=torch.bool):
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(dtype)
