"""The PI controller of log(beta) (algo/kl.py): a hand-computed trajectory, exact resume, and a
simulated run where it holds its target while Ziegler's rule with a horizon in rollouts cannot."""

import math
import random

import pytest

from hydrappo.algo.kl import AdaptiveKLController, PIKLController, build_kl_controller


def test_pi_controller_trajectory_by_hand():
    # beta_{t+1} = 0.1 * exp(0.5 e_t + 0.2 I_t), e_t = clip(log(KL_t / 6), -1, 1), I_t = sum of e.
    ctl = PIKLController(0.1, target=6.0, kp=0.5, ki=0.2)
    steps = [
        (0.0, -1.0, -1.0, 0.1 * 0.4965853037914095),  # KL = 0 (policy = reference): e = -1; exp(-0.7)
        (6.0 * math.e, 1.0, 0.0, 0.1 * 1.6487212707001282),  # e = 1, I back to 0: exp(0.5)
        (6.0 * math.exp(0.5), 0.5, 0.5, 0.1 * 1.4190675485932573),  # exp(0.25 + 0.1)
        (60.0, 1.0, 1.5, 0.1 * 2.225540928492468),  # log 10 clipped to 1: exp(0.5 + 0.3)
        (6.0, 0.0, 1.5, 0.1 * 1.3498588075760032),  # on target: only the integral stays, exp(0.3)
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
    ctl = build_kl_controller("pi", 0.05, 6.0, None, kp=0.1, ki=0.3)
    assert isinstance(ctl, PIKLController) and (ctl.value, ctl.kp, ctl.ki) == (0.05, 0.1, 0.3)
    with pytest.raises(ValueError, match="'pi'"):
        AdaptiveKLController(0.05, 6.0, 100).load_state_dict(ctl.state_dict())


def _simulate(controller, c: float, steps: int, lag: float, noise: float, seed: int) -> list[float]:
    """A synthetic run: the KL the policy settles at is c / beta (a larger coefficient holds it
    nearer the reference); the measured KL moves a share `lag` of the way there each step and
    carries multiplicative noise, as a batch estimate does. Returns the measured KL per step."""
    rng, kl, measured = random.Random(seed), c / controller.value if lag == 1 else 0.0, []
    for _ in range(steps):
        kl += lag * (c / controller.value - kl)
        observed = kl * math.exp(rng.gauss(0.0, noise))
        measured.append(observed)
        controller.update(observed, 32)
    return measured


@pytest.mark.parametrize("lag", [1.0, 0.2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pi_holds_the_target_where_ziegler_with_a_long_horizon_cannot(lag, seed):
    # beta_0 = 0.05 lets KL settle at 15 against a target of 6: beta must grow 2.5 times.
    target, c, steps = 6.0, 0.75, 40
    pi = _simulate(PIKLController(0.05, target), c, steps, lag, 0.1, seed)
    ziegler = _simulate(AdaptiveKLController(0.05, target, horizon=1000), c, steps, lag, 0.1, seed)
    last = slice(-10, None)
    pi_mean, ziegler_mean = sum(pi[last]) / 10, sum(ziegler[last]) / 10
    assert abs(pi_mean / target - 1) <= 0.25, pi
    assert ziegler_mean / target - 1 > 0.25, ziegler  # 32 rollouts / 1000: at most 0.64% a step
