"""KL between the policy and the frozen reference: per-token estimators and the KL coefficient.

RLHF keeps the policy near the reference policy with a penalty beta * KL(pi || pi_ref).
Only the sampled tokens' log-probs are available, so KL is estimated per token from
`logr = log pi_ref(x) - log pi(x)` with x ~ pi (Schulman, "Approximating KL divergence",
2020). beta is either fixed or adapted to hit a target KL (Ziegler et al. 2019).
"""

from __future__ import annotations

import math

import torch

KL_ESTIMATORS = ("k1", "k2", "k3", "abs")
KL_CONTROLLERS = ("adaptive", "fixed")


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the log-probs of tokens sampled from pi.

    With logr = ref_logprobs - logprobs (Schulman, "Approximating KL divergence"):

    - ``k1 = -logr = logp - logp_ref``: unbiased, high variance, can be negative.
    - ``k2 = 0.5 * logr**2``: biased, low variance, always >= 0.
    - ``k3 = exp(logr) - 1 - logr``: unbiased, low variance, always >= 0.
    - ``abs = |logr|``: biased, >= 0 (used by TRL).

    Elementwise: masking is the caller's business. Differentiable.
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        # expm1 keeps the precision of exp(x) - 1 for the small log-ratios that dominate.
        return torch.expm1(-log_ratio) + log_ratio
    if estimator == "abs":
        return log_ratio.abs()
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


def _finite_float(name: str, value) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


class _KLController:
    kind: str

    value: float

    def _check_kind(self, state: dict) -> None:
        kind = state.get("kind")
        if kind != self.kind:
            raise ValueError(
                f"cannot load a {kind!r} KL controller state into a {self.kind!r} controller; "
                "the checkpoint was written with a different ppo.kl_controller"
            )


class AdaptiveKLController(_KLController):
    """Proportional controller of the KL coefficient (Ziegler et al. 2019, section 2.2).

    After a batch with mean KL ``current_kl`` (nats per sequence) over ``n_steps`` rollouts:

        e_t = clip(current_kl / target - 1, -0.2, 0.2)
        beta_{t+1} = beta_t * (1 + e_t * n_steps / horizon)

    The clip bounds the change per update, so one outlier batch cannot swing beta.
    """

    kind = "adaptive"

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        self.value = _finite_float("init_kl_coef", init_kl_coef)
        self.target = _finite_float("kl target", target)
        self.horizon = _finite_float("kl horizon", horizon)
        if self.value < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {self.value}")
        if self.target <= 0:
            raise ValueError(f"the adaptive KL controller's target must be > 0, got {self.target}")
        if self.horizon <= 0:
            raise ValueError(f"the adaptive KL controller's horizon must be > 0, got {self.horizon}")

    def update(self, current_kl: float, n_steps: int) -> None:
        # A nan KL would make beta nan for the rest of the run, so refuse it here.
        current_kl = _finite_float("current_kl", current_kl)
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0, got {n_steps}")
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        """Restore value, target and horizon (like torch optimizers restore their hyperparameters)."""
        self._check_kind(state)
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = float(state["horizon"])

    def __repr__(self) -> str:
        return f"AdaptiveKLController(value={self.value}, target={self.target}, horizon={self.horizon})"


class FixedKLController(_KLController):
    """A constant KL coefficient (InstructGPT, Ouyang et al. 2022, uses a fixed beta)."""

    kind = "fixed"

    def __init__(self, kl_coef: float):
        self.value = _finite_float("kl_coef", kl_coef)
        if self.value < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.value}")

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self._check_kind(state)
        self.value = float(state["value"])

    def __repr__(self) -> str:
        return f"FixedKLController(value={self.value})"


def build_kl_controller(
    kind: str, init_kl_coef: float, target: float | None = None, horizon: float | None = None
) -> AdaptiveKLController | FixedKLController:
    """``"adaptive"`` -> AdaptiveKLController (needs target and horizon); ``"fixed"`` -> FixedKLController."""
    if kind == "adaptive":
        if target is None or horizon is None:
            raise ValueError("the adaptive KL controller needs both a target and a horizon")
        return AdaptiveKLController(init_kl_coef, target, horizon)
    if kind == "fixed":
        return FixedKLController(init_kl_coef)
    raise ValueError(f"unknown KL controller {kind!r}; valid: {', '.join(KL_CONTROLLERS)}")
