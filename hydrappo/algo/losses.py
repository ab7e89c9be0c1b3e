"""Losses to minimise: PPO's clipped policy and value losses, their aggregation, and the
losses of the supervised stages (Bradley-Terry preferences, response negative log-likelihood).

Per-token tensors are response-aligned, (B, R), with ``action_mask`` marking real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kl import KL_ESTIMATORS, kl_estimate
from .masked import bool_mask, check_same_shape, explained_variance, masked, masked_mean, masked_sum, to_floats, widened

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", denominator=None) -> torch.Tensor:
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

    ``denominator``: divide by this count instead of the batch's own (its tokens for
    token-mean, its non-empty rows otherwise): the count of a whole minibatch of which ``x``
    is one part (a micro-batch of gradient accumulation, one process's share), the sum of
    :func:`aggregation_weights` over all its rows. The parts' results then add up exactly to
    the whole minibatch's, however it was split (the token-mean of a split batch is not the
    mean of its parts' token-means).
    """
    mask = bool_mask(mask)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    if mode == "token-mean":
        return masked_mean(x, mask) if denominator is None else masked_sum(x, mask) / denominator
    per_row = masked_mean(x, mask, dim=-1) if mode == "seq-mean-token-mean" else masked_sum(x, mask, dim=-1)
    return masked_mean(per_row, mask.any(-1)) if denominator is None else per_row.sum() / denominator


def aggregation_weights(mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """(B,) what each row adds to :func:`aggregate`'s count: its tokens (token-mean), or 1 for a
    row with at least one token (the seq-* modes)."""
    mask = bool_mask(mask)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    return mask.sum(-1).float() if mode == "token-mean" else mask.any(-1).float()


@dataclass(frozen=True)
class PPOLossSettings:
    """How the PPO loss is computed, fixed for a step (train/step_plan.py builds it from the
    options); ppo_loss's docstring says what each one does."""

    cliprange: float = 0.2
    cliprange_high: float | None = None  # None: cliprange (a symmetric clip)
    cliprange_value: float | None = 0.2  # None: no value clipping
    vf_coef: float = 0.1
    ent_coef: float = 0.0
    dual_clip: float | None = None
    loss_agg_mode: str = "token-mean"
    importance_sampling_level: str = "token"
    kl_coef: float = 0.0  # the KL term's coefficient (0: no KL term)
    kl_estimator: str = "k3"

    def __post_init__(self):
        high = self.cliprange if self.cliprange_high is None else self.cliprange_high
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"unknown loss_agg_mode {self.loss_agg_mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
                f"got {self.importance_sampling_level!r}"
            )
        if not (self.cliprange > 0 and high > 0):
            raise ValueError(f"cliprange and cliprange_high must be > 0, got {self.cliprange} and {high}")
        if self.cliprange_value is not None and not self.cliprange_value > 0:
            raise ValueError(f"cliprange_value must be > 0 or None, got {self.cliprange_value}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (Ye et al. 2020) or None, got {self.dual_clip}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


@dataclass
class SampledTokens:
    """What the experience pass measured of the sampled tokens, (B, R) each: the old policy's
    side of the ratio. `values` and `returns` are None without a critic, `ref_logprobs` where
    the reference did not run."""

    logprobs: torch.Tensor
    advantages: torch.Tensor
    action_mask: torch.Tensor
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None


@dataclass
class PolicyTokens:
    """The current policy's pass over the same tokens, (B, R) each. `values` is None without a
    critic, `entropy` where the loss has no entropy term."""

    logprobs: torch.Tensor
    values: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


def ppo_loss(
    new: PolicyTokens,
    old: SampledTokens,
    settings: PPOLossSettings = PPOLossSettings(),
    loss_denominator: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """The PPO loss to minimise (Schulman et al. 2017, eq. 9: L = -L^CLIP + c1 L^VF - c2 H).

    Per token, with r = exp(logp - logp_old), eps_low = cliprange and eps_high = cliprange_high
    (default: eps_low):

        policy  = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))           (eq. 7)
                  and, with dual_clip = c > 1 and A < 0, min(policy, -c A)   (Ye et al. 2020)
        value   = 0.5 max((V - R)^2, (clip(V, V_old - cv, V_old + cv) - R)^2)
        kl      = kl_estimate(logp, logp_ref, kl_estimator)   (only with ref_logprobs)

    and ``loss = agg(policy) + vf_coef agg(value) - ent_coef agg(entropy) + kl_coef agg(kl)``
    with ``agg`` = :func:`aggregate` in ``loss_agg_mode``. Dual-clip bounds the loss of a
    token whose ratio exploded on a negative advantage. A larger ``cliprange_high`` is DAPO's
    clip-higher (Yu et al. 2025): it leaves low-probability tokens room to grow, against
    entropy collapse. ``importance_sampling_level="sequence"`` is GSPO (Zheng et al. 2025):
    every token of a response uses the response's length-normalised ratio
    r_i = exp(mean_t(logp - logp_old)), clipped as a whole (pair it with
    seq-mean-token-mean to get GSPO's objective exactly). The kl term is the alternative to
    putting the KL in the reward (:func:`shape_rewards`); k3 is its usual estimator there
    because it is non-negative with an unbiased, low-variance value (GRPO).
    ``cliprange_value=None`` turns value clipping off; ``new.values=None`` (a critic-free run)
    drops the value loss and its statistics. ``loss_denominator`` is ``aggregate``'s: this
    batch is one part of a larger minibatch (gradient accumulation, one of several
    processes), and the loss and its ``loss/*`` statistics are this part's share of it.

    Returns ``(loss, stats)``; stats are python floats, and the diagnostics (clip
    fractions, ratios, means) are masked token means whatever ``loss_agg_mode`` is.
    """
    with_critic = new.values is not None
    per_token = dict(
        logprobs=new.logprobs, old_logprobs=old.logprobs, advantages=old.advantages, action_mask=old.action_mask
    )
    if with_critic:
        per_token.update(values=new.values, old_values=old.values, returns=old.returns)
    if new.entropy is not None:
        per_token["entropy"] = new.entropy
    if old.ref_logprobs is not None:
        per_token["ref_logprobs"] = old.ref_logprobs
    check_same_shape(**per_token)
    cliprange, dual_clip, kl_coef = settings.cliprange, settings.dual_clip, settings.kl_coef
    cliprange_high = cliprange if settings.cliprange_high is None else settings.cliprange_high
    if settings.ent_coef != 0 and new.entropy is None:
        raise ValueError(f"ent_coef={settings.ent_coef} needs the per-token entropy (PolicyTokens.entropy)")
    if kl_coef > 0 and old.ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} in the loss needs ref_logprobs")

    mask = bool_mask(old.action_mask)
    # Zero every input at padding first: garbage there must not reach the loss or the gradients.
    logprobs, old_logprobs, advantages = (masked(x, mask) for x in (new.logprobs, old.logprobs, old.advantages))

    def agg(x):
        return aggregate(x, mask, settings.loss_agg_mode, loss_denominator)

    log_ratio = logprobs - old_logprobs
    if settings.importance_sampling_level == "sequence":
        log_ratio = masked(masked_mean(log_ratio, mask, dim=-1)[:, None].expand_as(log_ratio), mask)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - cliprange, 1 + cliprange_high)
    policy_losses = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        dual_clipped = (advantages < 0) & (-dual_clip * advantages < policy_losses)
        policy_losses = torch.where(dual_clipped, -dual_clip * advantages, policy_losses)
    policy_loss = agg(policy_losses)
    loss = policy_loss
    detached = ratio.detach()
    stats = {
        "loss/policy": policy_loss,
        "policy/approxkl": masked_mean(kl_estimate(logprobs.detach(), old_logprobs, "k3"), mask),
        "policy/clipfrac": masked_mean((clipped > unclipped).float(), mask),
        "policy/ratio_mean": masked_mean(detached, mask),
        # Ratios are positive, so 0 at padding cannot win the max.
        "policy/ratio_max": masked(detached, mask).max() if mask.numel() else detached.new_zeros(()),
    }
    if with_critic:
        values, old_values, returns = (masked(x, mask) for x in (new.values, old.values, old.returns))
        clip = settings.cliprange_value
        values_clipped = values if clip is None else old_values + (values - old_values).clamp(-clip, clip)
        value_unclipped, value_clipped = (values - returns).square(), (values_clipped - returns).square()
        value_loss = agg(0.5 * torch.maximum(value_unclipped, value_clipped))
        loss = loss + settings.vf_coef * value_loss
        stats.update(
            {
                "loss/value": value_loss,
                "val/clipfrac": masked_mean((value_clipped > value_unclipped).float(), mask),
                "val/var_explained": explained_variance(values.detach(), returns, mask),
                "val/mean": masked_mean(values.detach(), mask),
                "returns/mean": masked_mean(returns, mask),
            }
        )
    if dual_clip is not None:
        stats["policy/dual_clipfrac"] = masked_mean(dual_clipped.float(), mask)
    if new.entropy is not None:
        entropy = masked(new.entropy, mask)
        entropy_term = agg(entropy)
        loss = loss - settings.ent_coef * entropy_term
        stats["loss/entropy"] = entropy_term
        stats["policy/entropy"] = masked_mean(entropy.detach(), mask)
    if old.ref_logprobs is not None and kl_coef > 0:
        kl_term = agg(kl_estimate(logprobs, masked(old.ref_logprobs, mask), settings.kl_estimator))
        loss = loss + kl_coef * kl_term
        stats["loss/kl"] = kl_term
    stats["loss/total"] = loss
    return loss, to_floats(stats)


def preference_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """Bradley-Terry loss of (B,) reward scores: mean of -log sigmoid(r_c - r_r - margin).

    The reward-model loss of Stiennon et al. (2020) and Ouyang et al. (2022), with the optional
    per-pair margin of Touvron et al. (2023, Llama 2). Stats: ``accuracy`` (a tie counts half),
    ``margin`` (mean r_c - r_r), mean chosen and rejected scores. ``logsigmoid``, not
    ``log(sigmoid)``, so large gaps stay finite.

    (B, K) scores are K heads (a reward ensemble, algo/ensemble.py): each pair's loss of each head
    is weighted by its bootstrap count `counts` (B, K) (default 1) and the loss is
    sum(counts * loss) / (B * K), the mean loss of each head's resample in expectation (a
    Poisson(1) count has mean 1) with no batch that a head sees empty. The stats are then those
    of the heads' mean score, with each head's own accuracy as ``head_accuracy/<k>``."""
    chosen, rejected = widened(chosen), widened(rejected)
    gap = chosen - rejected
    if margin is not None:
        margin = margin.to(gap) if gap.dim() == 1 else margin.to(gap).unsqueeze(-1)
    target_gap = gap - margin if margin is not None else gap
    pair_losses = -F.logsigmoid(target_gap)
    loss = (pair_losses * counts.to(gap)).sum() / pair_losses.numel() if counts is not None else pair_losses.mean()
    with torch.no_grad():

        def accuracy_of(gaps):
            return ((gaps > 0).float() + 0.5 * (gaps == 0).float()).mean(0)

        several = gap.dim() == 2
        mean_gap = gap.mean(-1) if several else gap
        stats = {
            "loss": loss.detach(),
            "accuracy": accuracy_of(mean_gap),
            "margin": mean_gap.mean(),
            "chosen_score": chosen.mean(),
            "rejected_score": rejected.mean(),
        }
        if several:
            stats.update({f"head_accuracy/{k}": value for k, value in enumerate(accuracy_of(gap))})
    return loss, stats


def response_nll(logprobs: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token-mean negative log-likelihood, number of tokens) of the masked response tokens:
    the supervised fine-tuning loss, with no loss on the prompt (Ouyang et al. 2022)."""
    mask = bool_mask(action_mask)
    tokens = mask.sum()
    return -masked_sum(logprobs, mask) / tokens.clamp(min=1), tokens
