"""Masked statistics over padded (batch, length) tensors: the building blocks of the math.

Convention, relied on everywhere in algo/: masked positions are never read. Every input is
replaced by 0 there before any arithmetic (so padding holding garbage, even inf or nan,
changes no unmasked number and sends no nan gradient back), and every per-token output is
exactly 0 there. `torch.where`, never a product with the mask: nan * 0 is nan.
"""

from __future__ import annotations

import math

import torch


def bool_mask(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask, exactly 0 elsewhere (a product would turn garbage nan/inf into nan)."""
    return torch.where(bool_mask(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum of x over the masked-in entries (over everything, or along ``dim``)."""
    x = masked(x, mask)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x * m) / sum(m), over everything or along ``dim``; 0 where nothing is masked in.

    0 rather than nan for an empty selection, so that an empty response or batch cannot
    poison a loss or a running average.
    """
    mask = bool_mask(mask).expand_as(x)
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked-in entries: sum(m * (x - mean)^2) / (n - 1) (or / n if not unbiased).

    Returns 0 when there are too few entries (n < 2 unbiased, n < 1 biased): a lone
    token then whitens to 0 instead of nan.
    """
    mask = bool_mask(mask).expand_as(x)
    n = mask.sum()
    mean = masked_mean(x, mask)
    squares = masked_sum((x - mean).square(), mask)
    dof = n - 1 if unbiased else n
    return torch.where(dof > 0, squares / dof.clamp(min=1), torch.zeros_like(squares))


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked-in entries; 0 at masked positions.

    As ``whiten`` in OpenAI's lm-human-preferences (Ziegler et al. 2019): with
    ``shift_mean=False`` the mean is added back, rescaling without centring. The variance
    is the unbiased one, as in TRL's ``masked_whiten``.
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return masked(whitened, mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns), over masked-in tokens (0-d tensor).

    1: the critic predicts the returns; 0: no better than their mean; < 0: worse. nan when
    the returns have no variance (undefined, as in Stable-Baselines3 and CleanRL).
    """
    var_returns = masked_var(returns, mask, unbiased=False)
    var_residual = masked_var(returns - values, mask, unbiased=False)
    return torch.where(var_returns > 0, 1 - var_residual / var_returns, torch.full_like(var_returns, math.nan))


def explained_variance_parts(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(4,) masked token means of R, R^2, R - V and (R - V)^2: what :func:`explained_variance`
    needs, in a form that parts of a batch (micro-batches, processes) can average, weighted by
    their tokens, into the whole batch's (see :func:`explained_variance_of_parts`)."""
    residual = returns - values
    return torch.stack([masked_mean(t, mask) for t in (returns, returns.square(), residual, residual.square())])


def explained_variance_of_parts(returns_mean, returns_sq_mean, residual_mean, residual_sq_mean) -> float:
    """:func:`explained_variance` from the token means of :func:`explained_variance_parts`:
    1 - (E[e^2] - E[e]^2) / (E[R^2] - E[R]^2), with e = R - V; nan when the returns have no
    variance. Pass means accumulated in float64: the differences cancel."""
    var_returns = returns_sq_mean - returns_mean**2
    var_residual = residual_sq_mean - residual_mean**2
    return 1 - var_residual / var_returns if var_returns > 0 else math.nan


def last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """(B,) index of the last masked-in position of each row; -1 for an empty row."""
    mask = bool_mask(mask)
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask, positions, -1).amax(-1)


def check_same_shape(**tensors: torch.Tensor) -> None:
    (first_name, first), *rest = tensors.items()
    if first.dim() != 2:
        raise ValueError(f"{first_name} must be (batch, response_length), got shape {tuple(first.shape)}")
    for name, tensor in rest:
        if tensor.shape != first.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but {first_name} has {tuple(first.shape)}; "
                "all per-token tensors must be (batch, response_length)"
            )


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in at least float32: bf16/fp16 (and integers) become float32, float64 stays."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def to_floats(stats: dict) -> dict:
    """0-d tensors -> python floats with a single device sync."""
    return dict(zip(stats, torch.stack([widened(v.detach()) for v in stats.values()]).tolist()))
