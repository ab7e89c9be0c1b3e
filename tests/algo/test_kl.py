import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrappo.algo.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLSteering,
    PIKLController,
    build_kl_controller,
    kl_estimate,
)

LOGP = torch.tensor([[-0.1, -2.0]])
REF = torch.tensor([[-0.3, -1.5]])


def test_estimators_by_hand():
    # logp - logp_ref per token: 0.2 and -0.5.
    torch.testing.assert_close(kl_estimate(LOGP, REF, "k1"), torch.tensor([[-0.1 - -0.3, -2.0 - -1.5]]))
    torch.testing.assert_close(kl_estimate(LOGP, REF), kl_estimate(LOGP, REF, "k1"))
    torch.testing.assert_close(kl_estimate(LOGP, REF, "k2"), torch.tensor([[0.5 * 0.2**2, 0.5 * 0.5**2]]))
    # k3 = exp(logr) - 1 - logr with logr = ref - logp = -0.2, 0.5.
    k3 = [math.exp(-0.2) - 1 - -0.2, math.exp(0.5) - 1 - 0.5]
    torch.testing.assert_close(kl_estimate(LOGP, REF, "k3"), torch.tensor([k3]))
    torch.testing.assert_close(kl_estimate(LOGP, REF, "abs"), torch.tensor([[0.2, 0.5]]))


def test_estimators_zero_when_equal_and_differentiable():
    logp = torch.tensor([[-1.0, -0.5]], requires_grad=True)
    for name in KL_ESTIMATORS:
        assert torch.all(kl_estimate(logp, logp.detach(), name) == 0)
    kl_estimate(logp, REF, "k3").sum().backward()
    # d/dlogp [exp(ref - logp) - 1 - ref + logp] = 1 - exp(ref - logp)
    torch.testing.assert_close(logp.grad, 1 - torch.exp(REF - logp.detach()))


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match="k1, k2, k3, abs"):
        kl_estimate(LOGP, REF, "k4")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=8), st.lists(st.floats(-5, 5), min_size=1, max_size=8))
def test_k2_k3_abs_are_nonnegative(a, b):
    n = min(len(a), len(b))
    logp, ref = torch.tensor(a[:n], dtype=torch.float64), torch.tensor(b[:n], dtype=torch.float64)
    for name in ("k2", "k3", "abs"):
        assert torch.all(kl_estimate(logp, ref, name) >= 0)


def test_adaptive_controller_by_hand():
    ctl = AdaptiveKLController(0.2, target=6, horizon=10000)
    ctl.update(12, 256)  # e = clip(12 / 6 - 1, -0.2, 0.2) = 0.2
    assert ctl.value == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000))
    ctl = AdaptiveKLController(0.2, target=6, horizon=10000)
    ctl.update(5.4, 256)  # e = 5.4 / 6 - 1 = -0.1, inside the clip
    assert ctl.value == pytest.approx(0.2 * (1 + -0.1 * 256 / 10000))


def test_adaptive_controller_moves_towards_target_and_is_clipped():
    high, low, on_target = (AdaptiveKLController(0.1, 6, 100) for _ in range(3))
    high.update(1000.0, 10)  # far above the target: beta grows, by at most 20% * 10/100
    low.update(0.0, 10)  # far below: beta shrinks, by at most 20% * 10/100
    on_target.update(6.0, 10)
    assert high.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    assert low.value == pytest.approx(0.1 * (1 - 0.2 * 10 / 100))
    assert on_target.value == pytest.approx(0.1)


def test_fixed_controller_does_not_move():
    ctl = FixedKLController(0.05)
    ctl.update(1000.0, 64)
    ctl.update(0.0, 64)
    assert ctl.value == 0.05


@pytest.mark.parametrize(
    "args, message",
    [
        ((-0.1, 6, 100), "init_kl_coef"),
        ((0.1, 0, 100), "target"),
        ((0.1, 6, -1), "horizon"),
        ((0.1, math.nan, 100), "target"),
    ],
)
def test_adaptive_controller_validates(args, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveKLController(*args)


def test_controllers_validate_other_arguments():
    with pytest.raises(ValueError, match="kl_coef"):
        FixedKLController(-1.0)
    with pytest.raises(ValueError, match="current_kl"):
        AdaptiveKLController(0.1, 6, 100).update(math.nan, 8)


def test_state_dict_round_trip():
    ctl = AdaptiveKLController(0.2, 6, 10000)
    ctl.update(12.0, 256)
    state = json.loads(json.dumps(ctl.state_dict()))  # plain python values
    fresh = AdaptiveKLController(0.5, 1, 1)
    fresh.load_state_dict(state)
    assert (fresh.value, fresh.target, fresh.horizon) == (ctl.value, 6.0, 10000.0)

    fixed = FixedKLController(0.3)
    other = FixedKLController(0.0)
    other.load_state_dict(json.loads(json.dumps(fixed.state_dict())))
    assert other.value == 0.3


def test_loading_the_other_kind_is_an_error():
    with pytest.raises(ValueError, match="'fixed'.*'adaptive'"):
        AdaptiveKLController(0.2, 6, 100).load_state_dict(FixedKLController(0.1).state_dict())
    with pytest.raises(ValueError, match="'adaptive'.*'fixed'"):
        FixedKLController(0.1).load_state_dict(AdaptiveKLController(0.2, 6, 100).state_dict())


def test_build_kl_controller():
    adaptive = build_kl_controller("adaptive", 0.05, KLSteering(target=6.0, horizon=10000))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.05
    fixed = build_kl_controller("fixed", 0.05)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    with pytest.raises(ValueError, match="target and a horizon"):
        build_kl_controller("adaptive", 0.05)
    with pytest.raises(ValueError, match="adaptive, fixed"):
        build_kl_controller("pid", 0.05)


def test_retune_takes_the_steering_each_controller_reads_and_keeps_its_state():
    """A resumed run steers on with its own options; the coefficient (and the PI integral) go on."""
    steering = KLSteering(target=3.0, horizon=500, kp=1.5, ki=0.1)
    adaptive = AdaptiveKLController(0.2, 6.0, 100)
    adaptive.update(9.0, 10)
    value = adaptive.value
    adaptive.retune(steering)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (value, 3.0, 500.0)
    pi = PIKLController(0.05, 6.0, kp=2.0, ki=0.2)
    pi.update(9.0)
    state = (pi.value, pi.integral, pi.init)
    pi.retune(steering)
    assert (pi.value, pi.integral, pi.init) == state and (pi.target, pi.kp, pi.ki) == (3.0, 1.5, 0.1)
    fixed = FixedKLController(0.1)
    fixed.retune(steering)
    assert fixed.value == 0.1 and not hasattr(fixed, "target")
