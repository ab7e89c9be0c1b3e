"""The PI controller of log(beta) (algo/kl.py): a hand-computed trajectory, exact resume, and a
simulated run where it holds its target while Ziegler's rule with a horizon in rollouts cannot."""

import math
import random

import pytest

from hydrappo.algo.kl import AdaptiveKLController, KLSteering, PIKLController, build_kl_controller


def test_pi_controller_trajectory_by_hand():
    # The defaults: beta_{t+1} = 0.1 * exp(2 e_t + 0.2 I_t), e_t = clip(log(KL_t / 6), -0.5, 1), I_t = sum of e.
    ctl = PIKLController(0.1, target=6.0)
    steps = [
        (0.0, -0.5, -0.5, 0.1 * math.exp(-1.0 - 0.1)),  # KL = 0 (policy = reference): e = -0.5, the lower clip
        (6.0 * math.e, 1.0, 0.5, 0.1 * math.exp(2.0 + 0.1)),  # e = log e = 1
        (6.0 * math.exp(-2.0), -0.5, 0.0, 0.1 * math.exp(-1.0)),  # log-ratio -2 clipped to -0.5; I back to 0
        (60.0, 1.0, 1.0, 0.1 * math.exp(2.0 + 0.2)),  # log 10 clipped to 1
        (6.0, 0.0, 1.0, 0.1 * math.exp(0.2)),  # on target: only the integral stays
    ]
    for kl, error, integral, beta in steps:
        ctl.update(kl, 32)
        assert ctl.integral == pytest.approx(integral, abs=1e-12)
        assert ctl.value == pytest.approx(beta, rel=1e-12)
        assert ctl.error(kl) == pytest.approx(error, abs=1e-12)


def test_pi_controller_resumes_exactly():
    kls = [0.0, 3.0, 9.0, 14.0, 7.0, 5.5]
    whole = PIKLController(0.05, 6.0, kp=0.3, ki=0.1)
    for kl in kls:
        whole.update(kl, 16)
    first = PIKLController(0.05, 6.0, kp=0.3, ki=0.1)
    for kl in kls[:3]:
        first.update(kl, 16)
    resumed = PIKLController(0.9, 1.0)  # other settings: the state brings its own
    resumed.load_state_dict(first.state_dict())
    for kl in kls[3:]:
        resumed.update(kl, 16)
    assert resumed.state_dict() == whole.state_dict()  # bit for bit


def test_pi_controller_validates_and_is_built_by_name():
    for args in [(0.0, 6.0), (0.1, 0.0), (0.1, 6.0, -1.0, 0.1)]:
        with pytest.raises(ValueError):
            PIKLController(*args)
    with pytest.raises(ValueError, match="finite"):
        PIKLController(0.1, 6.0).update(math.nan, 1)
    ctl = build_kl_controller("pi", 0.05, KLSteering(target=6.0, kp=0.1, ki=0.3))
    assert isinstance(ctl, PIKLController) and (ctl.value, ctl.kp, ctl.ki) == (0.05, 0.1, 0.3)
    with pytest.raises(ValueError, match="'pi'"):
        AdaptiveKLController(0.05, 6.0, 100).load_state_dict(ctl.state_dict())


def _simulate(controller, steps: int, seed: int, plant: str) -> list[float]:
    """A synthetic run; returns the measured KL per step.

    "drift": the plant measured in the sentiment example's PPO run (docs/kl-control.md): the KL
    starts at 0 and changes each step by 0.83 - 10 beta nats (a least-squares fit over 30
    steps) plus Gaussian noise of the fit's residual, 1.1 nats; beta = 0.083 would hold it.
    "lag": the KL the policy settles at is c / beta (c = 0.75: beta must grow 2.5 times from
    0.05 to hold 6) and the KL moves 20% of the way there each step, with 10% noise.
    "ramp": the drift plant whose pull (0.83 nats a step) grows from 0 over its first 15 steps,
    with 0.5 nats of noise: the preference example's PPO, whose KL stayed under 1.5 nats for ten
    steps and then overshot a target of 4 to 7.6 (docs/kl-control.md)."""
    rng, kl, measured = random.Random(seed), 0.0, []
    for step in range(steps):
        if plant in ("drift", "ramp"):
            observed = kl
        else:
            kl += 0.2 * (0.75 / controller.value - kl)
            observed = kl * math.exp(rng.gauss(0.0, 0.1))
        measured.append(observed)
        controller.update(observed, 32)
        if plant == "drift":
            kl = max(0.0, kl + 0.83 - 10.0 * controller.value + rng.gauss(0.0, 1.1))
        elif plant == "ramp":
            kl = max(0.0, kl + 0.83 * min(1.0, (step + 1) / 15) - 10.0 * controller.value + rng.gauss(0.0, 0.5))
    return measured


def _held(make_controller, plant: str, seeds: int = 50, target: float = 6.0, steps: int = 45) -> int:
    """On how many of `seeds` simulated runs of `steps` (the sentiment example's length) the mean
    KL of the last 10 steps is within +-25% of the target (the batch estimate's noise makes a
    10-step mean scatter, so a share of seeds is what can be asserted, not every seed)."""
    held = 0
    for seed in range(seeds):
        measured = _simulate(make_controller(), steps, seed, plant)
        held += abs(sum(measured[-10:]) / 10 / target - 1) <= 0.25
    return held


@pytest.mark.parametrize(("plant", "at_least"), [("drift", 42), ("lag", 50)])
def test_pi_holds_the_target_where_ziegler_with_a_long_horizon_cannot(plant, at_least):
    # Measured when this was written: drift 45 of 50 seeds (the earlier gains, kp 0.5 and a
    # symmetric clip: 20), lag 50; Ziegler's rule 3 and 0: with 32 rollouts and a horizon of
    # 1,000 beta moves at most 0.64% a step, so the KL goes where beta_0 lets it.
    assert _held(lambda: PIKLController(0.05, 6.0), plant) >= at_least
    assert _held(lambda: AdaptiveKLController(0.05, 6.0, horizon=1000), plant) <= 5


def test_the_asymmetric_clip_keeps_the_first_steps_from_winding_beta_down():
    # While the policy is still at the reference (KL = 0) beta falls by exp(-(kp + ki) * 0.5) a
    # step at first, not exp(-(kp + ki)): a budget's controller lowers beta slowly, raises it fast.
    ctl = PIKLController(0.05, 6.0)
    ctl.update(0.0, 32)
    assert ctl.value == pytest.approx(0.05 * math.exp(-1.1), rel=1e-12)
    ctl.update(60.0, 32)  # far over the budget: the full upper clip
    assert ctl.value == pytest.approx(0.05 * math.exp(2.0 + 0.2 * 0.5), rel=1e-12)


def test_the_integral_floor_by_hand_and_from_an_old_checkpoint():
    # integral_min 0: the first two errors (-0.5 each) would take I to -1; the floor keeps it at 0,
    # so beta = 0.05 * exp(2 e) only; then a KL over the target integrates from 0 again.
    ctl = PIKLController(0.05, 4.0, integral_min=0.0)
    ctl.update(0.0, 32)
    ctl.update(1.0, 32)  # log(1/4) = -1.39, clipped to -0.5
    assert ctl.integral == 0.0 and ctl.value == pytest.approx(0.05 * math.exp(-1.0), rel=1e-12)
    ctl.update(4.0 * math.exp(0.25), 32)
    assert ctl.integral == pytest.approx(0.25) and ctl.value == pytest.approx(0.05 * math.exp(0.5 + 0.05), rel=1e-12)
    # A floor under 0 lets it wind down that far and no further.
    low = PIKLController(0.05, 4.0, integral_min=-0.75)
    for _ in range(3):
        low.update(0.0, 32)
    assert low.integral == -0.75
    # A checkpoint written before the floor existed has no integral_min: no floor, as it trained.
    state = ctl.state_dict()
    del state["integral_min"]
    resumed = PIKLController(0.05, 4.0, integral_min=-1.0)
    resumed.load_state_dict(state)
    assert resumed.integral_min is None and resumed.integral == ctl.integral
    with pytest.raises(ValueError, match="<= 0"):
        PIKLController(0.05, 4.0, integral_min=0.5)
    built = build_kl_controller("pi", 0.05, KLSteering(target=4.0, integral_min=0.0))
    assert built.integral_min == 0.0
    # A run resumed with other options (retune) meets the same rule as a new controller.
    built.retune(KLSteering(target=4.0, integral_min=-2.0))
    assert built.integral_min == -2.0
    with pytest.raises(ValueError, match="must be <= 0"):
        built.retune(KLSteering(target=4.0, integral_min=0.5))


def test_a_floor_at_zero_holds_the_target_where_a_slow_start_winds_the_integral_down():
    # Measured when this was written (50 seeds, target 4, 30 steps, the ramp plant): no floor 4
    # held (the KL overshot to 7.5 on average, as the preference example's 7.6); floor 0: 49.
    # On the drift and lag plants it held 45 and 50 (it only acts while the KL is under the target).
    assert _held(lambda: PIKLController(0.05, 4.0), "ramp", target=4.0, steps=30) <= 15
    assert _held(lambda: PIKLController(0.05, 4.0, integral_min=0.0), "ramp", target=4.0, steps=30) >= 45
    assert _held(lambda: PIKLController(0.05, 6.0, integral_min=0.0), "drift") >= 42
    assert _held(lambda: PIKLController(0.05, 6.0, integral_min=0.0), "lag") >= 45
