"""The numbers of PPO-RLHF as pure functions of tensors and masks.

Conventions, relied on by the trainer:

- Per-token tensors are response-aligned, shape (B, R): ``[b, t]`` is about the t-th
  generated token of row b. ``action_mask`` (B, R), bool or 0/1 float, marks real tokens.
- Masked positions are never read: every input is replaced by 0 there before any
  arithmetic (so padding holding garbage, even inf or nan, changes no unmasked number and
  sends no nan gradient back), and every per-token output is exactly 0 there.
"""

from __future__ import annotations

import math

import torch

from .kl import kl_estimate

SCORE_NORMALIZATIONS = ("none", "running", "ref")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


# ---------------------------------------------------------------------------- masked statistics
def _bool_mask(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask, exactly 0 elsewhere (a product would turn garbage nan/inf into nan)."""
    return torch.where(_bool_mask(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum of x over the masked-in entries (over everything, or along ``dim``)."""
    x = _masked(x, mask)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x * m) / sum(m), over everything or along ``dim``; 0 where nothing is masked in.

    0 rather than nan for an empty selection, so that an empty response or batch cannot
    poison a loss or a running average.
    """
    mask = _bool_mask(mask).expand_as(x)
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked-in entries: sum(m * (x - mean)^2) / (n - 1) (or / n if not unbiased).

    Returns 0 when there are too few entries (n < 2 unbiased, n < 1 biased): a lone
    token then whitens to 0 instead of nan.
    """
    mask = _bool_mask(mask).expand_as(x)
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
    return _masked(whitened, mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns), over masked-in tokens (0-d tensor).

    1: the critic predicts the returns; 0: no better than their mean; < 0: worse. nan when
    the returns have no variance (undefined, as in Stable-Baselines3 and CleanRL).
    """
    var_returns = masked_var(returns, mask, unbiased=False)
    var_residual = masked_var(returns - values, mask, unbiased=False)
    return torch.where(var_returns > 0, 1 - var_residual / var_returns, torch.full_like(var_returns, math.nan))


# ---------------------------------------------------------------------------- scores
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
            raise ValueError("score normalization 'ref' needs both ref_mean and ref_std (reward.score_ref_mean/score_ref_std)")
        if not ref_std > 0:
            raise ValueError(f"score normalization 'ref' needs ref_std > 0, got {ref_std}")
        return (scores - ref_mean) / ref_std
    raise ValueError(f"unknown score normalization {mode!r}; valid: {', '.join(SCORE_NORMALIZATIONS)}")


def last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """(B,) index of the last masked-in position of each row; -1 for an empty row."""
    mask = _bool_mask(mask)
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask, positions, -1).amax(-1)


def shape_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    action_mask: torch.Tensor,
    kl_coef: float,
    *,
    kl_estimator: str = "k1",
    kl_in_reward: bool = True,
    cliprange_reward: float | None = None,
    ended_with_eos: torch.Tensor | None = None,
    missing_eos_penalty: float | None = None,
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

    Rows with an empty response get no reward at all. Returns ``(rewards, stats)`` with
    python-float stats: ``kl_token_mean`` (masked mean of KL_t), ``kl_seq_mean`` (mean over
    rows of sum_t KL_t), ``score_mean`` (mean over non-empty rows of the score actually
    added, after penalty and clip), ``non_score_reward_mean`` (mean over rows of
    sum_t -kl_coef * KL_t; 0 without kl_in_reward) and, when ``ended_with_eos`` is given,
    ``missing_eos_frac``.
    """
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, action_mask=action_mask)
    if scores.shape != logprobs.shape[:1]:
        raise ValueError(f"scores must have shape ({logprobs.shape[0]},), got {tuple(scores.shape)}")
    if missing_eos_penalty is not None and ended_with_eos is None:
        raise ValueError("missing_eos_penalty needs ended_with_eos to know which responses lack an EOS")
    if cliprange_reward is not None and not cliprange_reward > 0:
        raise ValueError(f"cliprange_reward must be > 0 or None, got {cliprange_reward}")

    mask = _bool_mask(action_mask)
    dtype = torch.promote_types(torch.promote_types(logprobs.dtype, scores.dtype), torch.float32)
    kl = _masked(kl_estimate(_masked(logprobs, mask).to(dtype), _masked(ref_logprobs, mask).to(dtype), kl_estimator), mask)
    non_score = -kl_coef * kl if kl_in_reward else torch.zeros_like(kl)

    scores = scores.to(device=kl.device, dtype=dtype)
    if missing_eos_penalty is not None:
        ended = ended_with_eos.to(device=kl.device, dtype=torch.bool)
        scores = torch.where(ended, scores, torch.full_like(scores, missing_eos_penalty))
    if cliprange_reward is not None:
        scores = scores.clamp(-cliprange_reward, cliprange_reward)

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
    return rewards, _floats(stats)


# ---------------------------------------------------------------------------- advantages
def gae(
    rewards: torch.Tensor, values: torch.Tensor, action_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), per row of a padded batch.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t            (the value targets, "returns")

    Each row is one episode that ends after its last response token, so V and A after it
    are 0 (no bootstrap). Rewards and values at masked positions are set to 0 first and the
    recursion restarts at every masked position, so padding never leaks in. This is exact
    for right-padded rows (real tokens contiguous from t = 0) and for left padding; a mask
    with holes would be read as several episodes, one per run of real tokens.

    Returns ``(advantages, returns)``, detached (they are targets), 0 at masked positions.
    """
    _check_same_shape(rewards=rewards, values=values, action_mask=action_mask)
    mask = _bool_mask(action_mask)
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    rewards, values = _masked(rewards.detach(), mask).to(dtype), _masked(values.detach(), mask).to(dtype)
    length = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    next_advantage = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t + 1 < length else torch.zeros_like(next_advantage)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = torch.where(mask[:, t], delta + gamma * lam * next_advantage, 0.0)
        advantages[:, t] = next_advantage
    returns = _masked(advantages + values, mask)
    return advantages, returns


# ---------------------------------------------------------------------------- loss
def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a per-token loss (B, R) to a scalar.

    - ``token-mean``: sum_{b,t} m x / sum_{b,t} m; every token weighs the same, so long
      responses weigh more (TRL, trlX).
    - ``seq-mean-token-mean``: mean over rows of the per-row token mean; every response
      weighs the same, so a token of a short response weighs more.
    - ``seq-mean-token-sum``: mean over rows of the per-row token sum; no division by a
      response's length, whose bias towards long wrong answers Dr. GRPO (Liu et al. 2025)
      points out. Its scale grows with the response length.

    (The mode names are verl's.)

    Both ``seq-*`` modes average over rows with at least one token, so an empty response
    does not dilute the batch.
    """
    mask = _bool_mask(mask)
    if mode == "token-mean":
        return masked_mean(x, mask)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    per_row = masked_mean(x, mask, dim=-1) if mode == "seq-mean-token-mean" else masked_sum(x, mask, dim=-1)
    return masked_mean(per_row, mask.any(-1))


def ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    cliprange: float = 0.2,
    cliprange_value: float | None = 0.2,
    vf_coef: float = 0.1,
    ent_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    dual_clip: float | None = None,
    loss_agg_mode: str = "token-mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[torch.Tensor, dict]:
    """The PPO loss to minimise (Schulman et al. 2017, eq. 9: L = -L^CLIP + c1 L^VF - c2 H).

    Per token, with r = exp(logp - logp_old) and eps = cliprange:

        policy  = max(-A r, -A clip(r, 1 - eps, 1 + eps))                     (eq. 7)
                  and, with dual_clip = c > 1 and A < 0, min(policy, -c A)   (Ye et al. 2020)
        value   = 0.5 max((V - R)^2, (clip(V, V_old - cv, V_old + cv) - R)^2)
        kl      = kl_estimate(logp, logp_ref, kl_estimator)   (only with ref_logprobs)

    and ``loss = agg(policy) + vf_coef agg(value) - ent_coef agg(entropy) + kl_coef agg(kl)``
    with ``agg`` = :func:`aggregate` in ``loss_agg_mode``. Dual-clip bounds the loss of a
    token whose ratio exploded on a negative advantage. The kl term is the alternative to
    putting the KL in the reward (:func:`shape_rewards`); k3 is its usual estimator there
    because it is non-negative with an unbiased, low-variance value. ``cliprange_value=None``
    turns value clipping off.

    Returns ``(loss, stats)``; stats are python floats, and the diagnostics (clip
    fractions, ratios, means) are masked token means whatever ``loss_agg_mode`` is.
    """
    per_token = dict(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, values=values,
        old_values=old_values, returns=returns, action_mask=action_mask,
    )
    if entropy is not None:
        per_token["entropy"] = entropy
    if ref_logprobs is not None:
        per_token["ref_logprobs"] = ref_logprobs
    _check_same_shape(**per_token)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    if not cliprange > 0:
        raise ValueError(f"cliprange must be > 0, got {cliprange}")
    if cliprange_value is not None and not cliprange_value > 0:
        raise ValueError(f"cliprange_value must be > 0 or None, got {cliprange_value}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1 (Ye et al. 2020) or None, got {dual_clip}")
    if ent_coef != 0 and entropy is None:
        raise ValueError(f"ent_coef={ent_coef} needs the per-token entropy (entropy=...)")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} in the loss needs ref_logprobs")

    mask = _bool_mask(action_mask)
    # Zero every input at padding first: garbage there must not reach the loss or the gradients.
    logprobs, old_logprobs, advantages, values, old_values, returns = (
        _masked(x, mask) for x in (logprobs, old_logprobs, advantages, values, old_values, returns)
    )

    def agg(x):
        return aggregate(x, mask, loss_agg_mode)

    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - cliprange, 1 + cliprange)
    policy_losses = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        dual_clipped = (advantages < 0) & (-dual_clip * advantages < policy_losses)
        policy_losses = torch.where(dual_clipped, -dual_clip * advantages, policy_losses)
    policy_loss = agg(policy_losses)

    if cliprange_value is None:
        values_clipped = values
    else:
        values_clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    value_unclipped, value_clipped = (values - returns).square(), (values_clipped - returns).square()
    value_loss = agg(0.5 * torch.maximum(value_unclipped, value_clipped))

    loss = policy_loss + vf_coef * value_loss
    detached = ratio.detach()
    stats = {
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "policy/approxkl": masked_mean(kl_estimate(logprobs.detach(), old_logprobs, "k3"), mask),
        "policy/clipfrac": masked_mean((clipped > unclipped).float(), mask),
        "policy/ratio_mean": masked_mean(detached, mask),
        # Ratios are positive, so 0 at padding cannot win the max.
        "policy/ratio_max": _masked(detached, mask).max() if mask.numel() else detached.new_zeros(()),
        "val/clipfrac": masked_mean((value_clipped > value_unclipped).float(), mask),
        "val/var_explained": explained_variance(values.detach(), returns, mask),
        "val/mean": masked_mean(values.detach(), mask),
        "returns/mean": masked_mean(returns, mask),
    }
    if dual_clip is not None:
        stats["policy/dual_clipfrac"] = masked_mean(dual_clipped.float(), mask)
    if entropy is not None:
        entropy = _masked(entropy, mask)
        entropy_term = agg(entropy)
        loss = loss - ent_coef * entropy_term
        stats["loss/entropy"] = entropy_term
        stats["policy/entropy"] = masked_mean(entropy.detach(), mask)
    if ref_logprobs is not None and kl_coef > 0:
        kl_term = agg(kl_estimate(logprobs, _masked(ref_logprobs, mask), kl_estimator))
        loss = loss + kl_coef * kl_term
        stats["loss/kl"] = kl_term
    stats["loss/total"] = loss
    return loss, _floats(stats)


# ---------------------------------------------------------------------------- helpers
def _check_same_shape(**tensors: torch.Tensor) -> None:
    (first_name, first), *rest = tensors.items()
    if first.dim() != 2:
        raise ValueError(f"{first_name} must be (batch, response_length), got shape {tuple(first.shape)}")
    for name, tensor in rest:
        if tensor.shape != first.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but {first_name} has {tuple(first.shape)}; "
                "all per-token tensors must be (batch, response_length)"
            )


def _floats(stats: dict) -> dict:
    """0-d tensors -> python floats with a single device sync."""
    return dict(zip(stats, torch.stack([v.detach().float() for v in stats.values()]).tolist()))
