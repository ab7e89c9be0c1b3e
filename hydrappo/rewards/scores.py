"""What a reward source returns, made a (B,) float32 tensor of scores, and how a failing source's
message shows a sample. A sample a function returned None for (TRL: no score for it) is NaN:
unscored."""

from __future__ import annotations

import numbers

import numpy as np
import torch

from ..errors import RewardFunctionError, shortened


def where_at(source: str, step: int | None) -> str:
    """'reward function 'f.py:score' at step 3': a source and the step, for messages."""
    return f"{source} at step {step}" if step is not None else source


def sample_text(prompts, outputs, row: int) -> str:
    """' Sample 3: prompt '...', response '...'.' for an error message ('' without the texts)."""
    if prompts is None or outputs is None or not 0 <= row < len(outputs):
        return ""
    return f" Sample {row}: prompt {shortened(str(prompts[row]))}, response {shortened(str(outputs[row]))}."


def _is_number(value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim == 0 or value.shape == (1,)
    return isinstance(value, (numbers.Real, np.number))


def to_scores(result, count: int, source: str, prompts=None, outputs=None) -> torch.Tensor:
    """A (count,) float32 CPU tensor from whatever sequence of numbers a source returned;
    anything else is a RewardFunctionError naming `source` and showing an offending sample."""
    if result is None:
        raise RewardFunctionError(f"{source} returned None; it must return one score per sample (missing `return`?).")
    if isinstance(result, torch.Tensor):
        scores = result.detach().to("cpu", torch.float32)
    else:
        if isinstance(result, (list, tuple)):  # None: TRL's "no score for this sample" (NaN here, unscored)
            bad = next((i for i, value in enumerate(result) if not (_is_number(value) or value is None)), None)
            if bad is not None:
                raise RewardFunctionError(
                    f"{source} returned {type(result).__name__} that is not numbers: item {bad} is "
                    f"{type(result[bad]).__name__} {repr(result[bad])[:40]}; return one number per sample."
                    f"{sample_text(prompts, outputs, bad)}"
                )
        try:
            values = [np.nan if v is None else v for v in result] if isinstance(result, (list, tuple)) else result
            scores = torch.from_numpy(np.asarray(values, dtype=np.float64)).to(torch.float32)
        except (TypeError, ValueError) as error:
            raise RewardFunctionError(
                f"{source} returned {type(result).__name__} that is not numbers ({error}); "
                f"return a list, tuple, numpy array or tensor of numbers, one per sample.{sample_text(prompts, outputs, 0)}"
            ) from None
    if scores.ndim == 2 and scores.shape[1] == 1:  # a (B, 1) column, as classifiers give
        scores = scores[:, 0]
    if scores.ndim != 1 or scores.shape[0] != count:
        raise RewardFunctionError(
            f"{source} returned scores of shape {tuple(scores.shape)} for {count} samples; return one score per "
            f"sample.{sample_text(prompts, outputs, 0 if scores.ndim != 1 else min(scores.shape[0], count - 1))}"
        )
    unscored = [v is None for v in result] if isinstance(result, (list, tuple)) else [False] * count
    bad = (~torch.isfinite(scores) & ~torch.tensor(unscored, dtype=torch.bool)).nonzero().flatten().tolist()
    if bad:
        shown = ", ".join(f"{i} ({scores[i].item()})" for i in bad[:10])
        raise RewardFunctionError(
            f"{source} returned non-finite scores for {len(bad)} sample(s), at rows: {shown}.{sample_text(prompts, outputs, bad[0])}"
        )
    return scores
