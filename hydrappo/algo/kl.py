"""KL between the policy and the frozen reference: per-token estimators and the KL coefficient.

RLHF keeps the policy near the reference policy with a penalty beta * KL(pi || pi_ref).
Only the sampled tokens' log-probs are available, so KL is estimated per token from
`logr = log pi_ref(x) - log pi(x)` with x ~ pi (Schulman, "Approximating KL divergence",
2020). beta is either fixed, adapted to hit a target KL by Ziegler et al.'s (2019) rule, or
steered to the target by a proportional-integral controller on log(beta) (after Stooke,
Achiam and Abbeel 2020, "Responsive Safety in Reinforcement Learning by PID Lagrangian
Methods"), whose gains are per step, so that it holds its target within a run of tens of steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

KL_ESTIMATORS = ("k1", "k2", "k3", "abs")


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


def _integral_floor(value) -> float | None:
    """The PI controller's floor under its integral: None (no floor) or a finite number <= 0, the
    integral's start (a floor above it would hold the integral off its own start)."""
    if value is None:
        return None
    floor = _finite_float("kl_pi_integral_min", value)
    if floor > 0:
        raise ValueError(
            f"the PI KL controller's integral starts at 0, so its floor kl_pi_integral_min must be <= 0, got {floor}"
        )
    return floor


@dataclass(frozen=True)
class KLSteering:
    """What steers a KL coefficient towards its target, from the options (ppo.kl_target,
    kl_horizon, kl_pi_kp, kl_pi_ki, kl_pi_integral_min): each controller reads the ones it uses."""

    target: float | None = None
    horizon: float | None = None
    kp: float = 2.0
    ki: float = 0.2
    integral_min: float | None = None


class KLController:
    kind: str

    value: float

    @classmethod
    def build(cls, init_kl_coef: float, steering: KLSteering) -> KLController:
        """A controller starting at `init_kl_coef`, steered by what `steering` holds for it."""
        raise NotImplementedError

    def retune(self, steering: KLSteering) -> None:
        """Take this run's steering (a resumed run's options) and keep the state: the
        coefficient, and the PI controller's integral."""
        raise NotImplementedError

    def _check_kind(self, state: dict) -> None:
        kind = state.get("kind")
        if kind != self.kind:
            raise ValueError(
                f"cannot load a {kind!r} KL controller state into a {self.kind!r} controller; "
                "the checkpoint was written with a different ppo.kl_controller"
            )


class AdaptiveKLController(KLController):
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

    @classmethod
    def build(cls, init_kl_coef: float, steering: KLSteering) -> AdaptiveKLController:
        if steering.target is None or steering.horizon is None:
            raise ValueError("the adaptive KL controller needs both a target and a horizon")
        return cls(init_kl_coef, steering.target, steering.horizon)

    def retune(self, steering: KLSteering) -> None:
        self.target, self.horizon = float(steering.target), float(steering.horizon)

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


class PIKLController(KLController):
    """Proportional-integral control of log(beta) towards a target KL, one update per step.

    Ziegler's rule moves beta by at most ``0.2 * n_steps / horizon`` per update, so with a
    horizon in rollouts that dwarfs a short run the target is never reached. Here the gains
    are per step. After a step whose sequences have mean KL ``current_kl`` (nats):

        e_t = clip(log(current_kl / target), -clip_low, clip_high)   (-clip_low if KL <= 0)
        I_t = max(I_{t-1} + e_t, integral_min)                        (I_0 = 0; no floor by default)
        beta_{t+1} = beta_0 * exp(kp * e_t + ki * I_t)

    This is the PI form of Stooke, Achiam and Abbeel (2020, eq. 8: lambda = Kp e + Ki I) with
    the Lagrange multiplier replaced by log(beta), so beta stays positive without a
    projection and the error is a ratio, matching the roughly multiplicative response of KL to
    beta.

    The defaults come from the KL measured in PPO runs (docs/kl-control.md): the KL does not
    jump to where a coefficient would hold it, it drifts, each step's change set by beta
    (sentiment example: dKL ~ 0.83 - 10 beta nats a step, +-1.1 nats of noise), an
    integrating plant. Against it:
      - the proportional gain does the damping (kp = 2): beta answers the KL's level at once,
        where the integral alone would let it swing past the target and back;
      - the error is clipped asymmetrically: over the target by up to e^1, under it by at
        most e^-0.5. A KL target is a budget: beta must rise fast when the KL exceeds it,
        while a KL under it in the first steps only says the policy has not moved yet; with a
        symmetric clip those steps wound the integral down (beta 0.05 -> 0.012 in 9 steps of
        the sentiment run) and the KL then overshot to 2.4x the target. (Stooke et al. bound
        their integral at 0 for the same reason; a bounded negative error keeps beta able to
        fall when the start was too large.)
      - the integral's floor (``integral_min``, off by default) is that bound, for a policy that
        stays far under the target for many steps: the clip bounds how fast the integral winds
        down, not how far, and in the preference example ten slow steps took beta from 0.05 to
        0.007 before the KL arrived and overshot the target by 40-66%. A floor of 0 (Stooke et
        al.'s) keeps beta >= beta_0 * exp(-kp * clip_low) while the KL is under the target.
    On an instantaneous plant (KL = c / beta the next step) a proportional gain above 1 makes
    beta alternate; no measured run behaves so, and the tests simulate the measured plant.
    """

    kind = "pi"

    def __init__(
        self,
        init_kl_coef: float,
        target: float,
        kp: float = 2.0,
        ki: float = 0.2,
        clip_low: float = 0.5,
        clip_high: float = 1.0,
        integral_min: float | None = None,
    ):
        self.init = _finite_float("init_kl_coef", init_kl_coef)
        self.target = _finite_float("kl target", target)
        self.kp = _finite_float("kl_pi_kp", kp)
        self.ki = _finite_float("kl_pi_ki", ki)
        self.clip_low = _finite_float("clip_low", clip_low)
        self.clip_high = _finite_float("clip_high", clip_high)
        if self.init <= 0:
            raise ValueError(f"the PI KL controller steers log(beta), so init_kl_coef must be > 0, got {self.init}")
        if self.target <= 0:
            raise ValueError(f"the PI KL controller's target must be > 0, got {self.target}")
        if self.kp < 0 or self.ki < 0 or self.clip_low <= 0 or self.clip_high <= 0:
            raise ValueError(
                f"the PI KL controller needs kp >= 0, ki >= 0 and positive error clips, got kp {self.kp}, ki {self.ki}, "
                f"clips {self.clip_low}, {self.clip_high}"
            )
        self.integral_min = _integral_floor(integral_min)
        self.integral = 0.0
        self.value = self.init

    @classmethod
    def build(cls, init_kl_coef: float, steering: KLSteering) -> PIKLController:
        if steering.target is None:
            raise ValueError("the PI KL controller needs a target")
        return cls(init_kl_coef, steering.target, kp=steering.kp, ki=steering.ki, integral_min=steering.integral_min)

    def retune(self, steering: KLSteering) -> None:
        self.target, self.kp, self.ki = float(steering.target), float(steering.kp), float(steering.ki)
        self.integral_min = _integral_floor(steering.integral_min)

    def error(self, current_kl: float) -> float:
        """The clipped log-ratio of the measured KL to the target."""
        if current_kl <= 0:
            return -self.clip_low
        return min(max(math.log(current_kl / self.target), -self.clip_low), self.clip_high)

    def update(self, current_kl: float, n_steps: int = 1) -> None:
        """One step's update (``n_steps``, the rollouts of the step, is accepted for the common
        interface and not used: the gains are per step)."""
        current_kl = _finite_float("current_kl", current_kl)
        error = self.error(current_kl)
        self.integral += error
        if self.integral_min is not None:
            self.integral = max(self.integral, self.integral_min)
        self.value = self.init * math.exp(self.kp * error + self.ki * self.integral)

    def state_dict(self) -> dict:
        return {
            "kind": self.kind,
            "value": self.value,
            "init": self.init,
            "integral": self.integral,
            "target": self.target,
            "kp": self.kp,
            "ki": self.ki,
            "clip_low": self.clip_low,
            "clip_high": self.clip_high,
            "integral_min": self.integral_min,
        }

    def load_state_dict(self, state: dict) -> None:
        self._check_kind(state)
        for key in ("value", "init", "integral", "target", "kp", "ki", "clip_low", "clip_high"):
            setattr(self, key, float(state[key]))
        # A checkpoint written before the floor existed has none.
        self.integral_min = _integral_floor(state.get("integral_min"))

    def __repr__(self) -> str:
        return (
            f"PIKLController(value={self.value}, target={self.target}, kp={self.kp}, ki={self.ki}, "
            f"integral={self.integral}, integral_min={self.integral_min})"
        )


class FixedKLController(KLController):
    """A constant KL coefficient (InstructGPT, Ouyang et al. 2022, uses a fixed beta)."""

    kind = "fixed"

    def __init__(self, kl_coef: float):
        self.value = _finite_float("kl_coef", kl_coef)
        if self.value < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.value}")

    @classmethod
    def build(cls, init_kl_coef: float, steering: KLSteering) -> FixedKLController:
        return cls(init_kl_coef)

    def retune(self, steering: KLSteering) -> None:
        pass  # nothing steers a fixed coefficient

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self._check_kind(state)
        self.value = float(state["value"])

    def __repr__(self) -> str:
        return f"FixedKLController(value={self.value})"


# The controllers by the name ppo.kl_controller gives them: adding one is a class and a row here.
KL_CONTROLLER_TYPES = {c.kind: c for c in (AdaptiveKLController, FixedKLController, PIKLController)}
KL_CONTROLLERS = tuple(KL_CONTROLLER_TYPES)


def build_kl_controller(kind: str, init_kl_coef: float, steering: KLSteering = KLSteering()) -> KLController:
    """The controller `kind` names (KL_CONTROLLER_TYPES), starting at `init_kl_coef`:
    ``"adaptive"`` (needs steering.target and horizon), ``"pi"`` (needs steering.target; gains
    kp, ki) or ``"fixed"``."""
    if kind not in KL_CONTROLLER_TYPES:
        raise ValueError(f"unknown KL controller {kind!r}; valid: {', '.join(KL_CONTROLLERS)}")
    return KL_CONTROLLER_TYPES[kind].build(init_kl_coef, steering)
