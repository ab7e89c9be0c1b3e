"""Sequence scores: normalisation, reward shaping with the KL penalty, score statistics.

Per-token tensors are response-aligned, shape (B, R): ``[b, t]`` is about the t-th generated
token of row b, and ``action_mask`` (B, R), bool or 0/1 float, marks real tokens.
"""

from __future__ import annotations

import math

import torch

from .kl import kl_estimate
from .masked import bool_mask, check_same_shape, last_true_index, masked, masked_mean, to_floats, widened

SCORE_NORMALIZATIONS = ("none", "running", "ref")


class RunningMoments:
    """Mean and (unbiased) std of every score seen so far.

    Merges each batch with the parallel algorithm of Chan et al. (1979): for counts
    n_a, n_b, means mu_a, mu_b and sums of squared deviations M2_a, M2_b,

        delta = mu_b - mu_a, n = n_a + n_b
        mu = mu_a + delta * n_b / n
        M2 = M2_a + M2_b + delta^2 * n_a * n_b / n

    Kept as python floats (float64) so the state is exact and JSON-safe.
    """

    def __init__(self):
        self.count = 0.0
        self.mean = 0.0
        self.m2 = 0.0

    @property
    def var(self) -> float:
        return self.m2 / (self.count - 1) if self.count > 1 else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> tuple[float, float]:
        """Add the entries of x; returns this batch's (mean, unbiased std), std 0 for one entry."""
        x = x.detach().double().flatten()
        n_b = float(x.numel())
        if n_b == 0:
            return 0.0, 0.0
        mean_b = x.mean().item()
        m2_b = (x - mean_b).square().sum().item()
        n = self.count + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta**2 * self.count * n_b / n
        self.count = n
        return mean_b, math.sqrt(m2_b / (n_b - 1)) if n_b > 1 else 0.0

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.mean, self.m2 = float(state["count"]), float(state["mean"]), float(state["m2"])

    def __repr__(self) -> str:
        return f"RunningMoments(count={self.count:g}, mean={self.mean:.6g}, std={self.std:.6g})"


def normalize_scores(
    scores: torch.Tensor,
    mode: str,
    moments: RunningMoments | None = None,
    ref_mean: float | None = None,
    ref_std: float | None = None,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Bring the sequence scores (B,) to a fixed scale, so beta and the value head see stable numbers.

    - ``"none"``: scores unchanged.
    - ``"running"``: update ``moments`` with this batch, then (s - mean) / (std + eps) with
      the running statistics of all scores seen (TRL's ``use_score_scaling``).
    - ``"ref"``: (s - ref_mean) / ref_std with fixed statistics, e.g. the reward model's
      mean and std on reference-policy samples, as lm-human-preferences normalises its
      reward model (Ziegler et al. 2019; Huang et al. 2024, "The N+ implementation
      details of RLHF with PPO").
    """
    if mode == "none":
        return scores
    if mode == "running":
        if moments is None:
            raise ValueError("score normalization 'running' needs a RunningMoments (moments=...)")
        moments.update(scores)
        return (scores - moments.mean) / (moments.std + eps)
    if mode == "ref":
        if ref_mean is None or ref_std is None:
            raise ValueError(
                "score normalization 'ref' needs both ref_mean and ref_std (reward.score_ref_mean/score_ref_std)"
            )
        if not ref_std > 0:
            raise ValueError(f"score normalization 'ref' needs ref_std > 0, got {ref_std}")
        return (scores - ref_mean) / ref_std
    raise ValueError(f"unknown score normalization {mode!r}; valid: {', '.join(SCORE_NORMALIZATIONS)}")


def shape_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    action_mask: torch.Tensor,
    kl_coef: float,
    *,
    kl_estimator: str = "k1",
    kl_in_reward: bool = True,
    cliprange_reward: float | None = None,
    ended_with_eos: torch.Tensor | None = None,
    missing_eos_penalty: float | None = None,
    group_baseline: int = 0,
) -> tuple[torch.Tensor, dict]:
    """Per-token rewards (B, R) from sequence scores (B,) and the KL penalty.

        r_t = -kl_coef * KL_t                  on every response token (if kl_in_reward)
        r_T += clip(score, -c, c)              T = last response token of the row

    The KL-in-reward form is InstructGPT's R(x, y) = r(x, y) - beta * log(pi/pi_ref)
    (Ouyang et al. 2022; Ziegler et al. 2019), spread over the tokens; KL_t is
    ``kl_estimate(..., kl_estimator)``. T is the last True of ``action_mask``: the EOS when
    the response has one, else its last generated token.

    With ``missing_eos_penalty`` and ``ended_with_eos`` (bool (B,)), the score of a
    response that never emitted EOS is replaced by ``missing_eos_penalty`` before
    clipping (Huang et al. 2024; TRL's ``non_eos_penalty`` with ``penalty_reward_value``),
    so rambling until the length limit is never worth more than that.

    ``group_baseline=G`` subtracts from each score (after penalty and clip) the mean score of
    its group of G consecutive rows (the G samples of one prompt): REINFORCE++-baseline (Hu
    2025). ``ref_logprobs=None`` (the reference was not run) means no KL: allowed only when
    the KL does not enter the reward (``kl_coef == 0`` or ``kl_in_reward=False``).

    Rows with an empty response get no reward at all. Returns ``(rewards, stats)`` with
    python-float stats: ``kl_token_mean`` (masked mean of KL_t), ``kl_seq_mean`` (mean over
    rows of sum_t KL_t), ``score_mean`` (mean over non-empty rows of the score actually
    added, after penalty and clip), ``non_score_reward_mean`` (mean over rows of
    sum_t -kl_coef * KL_t; 0 without kl_in_reward) and, when ``ended_with_eos`` is given,
    ``missing_eos_frac``.
    """
    if ref_logprobs is None:
        if kl_in_reward and kl_coef != 0:
            raise ValueError(f"kl_coef={kl_coef} in the reward needs ref_logprobs")
        ref_logprobs = logprobs
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, action_mask=action_mask)
    if scores.shape != logprobs.shape[:1]:
        raise ValueError(f"scores must have shape ({logprobs.shape[0]},), got {tuple(scores.shape)}")
    if missing_eos_penalty is not None and ended_with_eos is None:
        raise ValueError("missing_eos_penalty needs ended_with_eos to know which responses lack an EOS")
    if cliprange_reward is not None and not cliprange_reward > 0:
        raise ValueError(f"cliprange_reward must be > 0 or None, got {cliprange_reward}")

    mask = bool_mask(action_mask)
    dtype = torch.promote_types(torch.promote_types(logprobs.dtype, scores.dtype), torch.float32)
    kl = masked(kl_estimate(masked(logprobs, mask).to(dtype), masked(ref_logprobs, mask).to(dtype), kl_estimator), mask)
    non_score = -kl_coef * kl if kl_in_reward else torch.zeros_like(kl)

    scores = scores.to(device=kl.device, dtype=dtype)
    if missing_eos_penalty is not None:
        ended = ended_with_eos.to(device=kl.device, dtype=torch.bool)
        scores = torch.where(ended, scores, torch.full_like(scores, missing_eos_penalty))
    if cliprange_reward is not None:
        scores = scores.clamp(-cliprange_reward, cliprange_reward)
    if group_baseline:
        groups = scores.reshape(-1, group_baseline)
        scores = (groups - groups.mean(-1, keepdim=True)).reshape(-1)

    last = last_true_index(mask)
    scores = torch.where(last >= 0, scores, torch.zeros_like(scores))
    rewards = non_score.scatter_add(1, last.clamp(min=0)[:, None], scores[:, None])

    stats = {
        "kl_token_mean": masked_mean(kl, mask),
        "kl_seq_mean": kl.sum(-1).mean(),
        "score_mean": masked_mean(scores, last >= 0),
        "non_score_reward_mean": non_score.sum(-1).mean(),
    }
    if ended_with_eos is not None:
        stats["missing_eos_frac"] = (~ended_with_eos.to(device=kl.device, dtype=torch.bool)).float().mean()
    return rewards, to_floats(stats)


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), added to the score:

        R(y) = 0                                  if |y| <= L_max - L_cache
             = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
             = -1                                 if |y| > L_max

    times ``factor``: 0 up to ``buffer`` (L_cache) tokens before the limit, then falling
    linearly to -factor at ``max_length`` (L_max, generation.max_new_tokens), so a response
    that runs to the limit loses what it gained by rambling, gradually rather than at a cliff.
    ``lengths`` (B,) are response lengths in tokens. ``buffer = 0`` means no penalty."""
    if buffer < 0 or buffer > max_length:
        raise ValueError(f"the overlong buffer must be in [0, max_length={max_length}], got {buffer}")
    lengths = lengths.to(torch.float64 if lengths.dtype == torch.float64 else torch.float32)
    if buffer == 0:
        return torch.zeros_like(lengths)
    start = max_length - buffer
    return factor * ((start - lengths) / buffer).clamp(min=-1.0, max=0.0)


def overlong_filter(action_mask: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
    """DAPO's overlong filtering (Yu et al. 2025, section 3.3): the loss mask without the tokens
    of truncated responses (``ended`` False: cut by the length limit), so that an answer whose
    reward the limit decided teaches nothing either way. (B, R) mask, (B,) bool."""
    return action_mask * ended.to(device=action_mask.device, dtype=action_mask.dtype)[:, None]


def score_statistics(scores: torch.Tensor) -> tuple[float, float]:
    """(mean, unbiased std) of a set of scores, e.g. a reward model's on reference-policy
    samples, to normalise with (``normalize_scores(..., "ref")``); the std must be positive."""
    scores = scores.double().flatten()
    if scores.numel() < 2:
        raise ValueError(f"score statistics need at least 2 scores, got {scores.numel()}.")
    mean, std = scores.mean().item(), scores.std().item()
    if not (math.isfinite(mean) and math.isfinite(std)) or std <= 0:
        raise ValueError(f"degenerate reward scores on the reference set (mean {mean}, std {std}).")
    return mean, std


def group_statistics(scores: torch.Tensor, group_size: int) -> dict:
    """What a batch of scores says about the learning signal, as python floats:
    ``env/groups_all_equal_frac``, the share of prompts whose G samples all got the same
    score (a group baseline gives them no gradient; DAPO's dynamic sampling filters them
    out), with G > 1; and ``env/solve_rate``, the mean score, when every score is 0 or 1 (a
    verifiable reward)."""
    stats = {}
    scores = widened(scores.detach()).flatten()
    if group_size > 1:
        groups = scores.reshape(-1, group_size)
        stats["env/groups_all_equal_frac"] = (groups == groups[:, :1]).all(-1).float().mean().item()
    if scores.numel() and bool(((scores == 0) | (scores == 1)).all()):
        stats["env/solve_rate"] = scores.mean().item()
    return stats


def fill_unscored(scores: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, unscored mask) for samples no reward scored (TRL's reward functions return None for
    them: NaN here). Each such sample takes the mean of its group's scored samples (0 when none is
    scored), so the group mean a baseline subtracts is the scored samples' own, as TRL's nanmean;
    the trainer then drops its tokens from the loss (TRL gives it advantage 0). Unlike TRL's
    nanstd, a group's std counts the filled values (they sit at its mean: the std shrinks by at
    most sqrt(scored / G)). Shapes (B,), B a multiple of `group_size` (1: no groups, mean of all)."""
    unscored = torch.isnan(scores)
    groups = scores.reshape(-1, group_size) if group_size > 1 else scores.reshape(1, -1)
    valid = ~torch.isnan(groups)
    means = groups.nan_to_num(0.0).sum(-1) / valid.sum(-1).clamp(min=1)
    filled = torch.where(valid, groups, means[:, None].to(groups.dtype))
    return filled.reshape(scores.shape), unscored
