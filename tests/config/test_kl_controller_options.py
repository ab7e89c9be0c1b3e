"""The KL controller's options: each one that only one controller reads is refused with the others."""

import pytest

from hydrappo.config import ConfigError, parse_config

from runs import TINY

BASE = ["--reward_fn", f"{TINY}/reward.py:reward_fn", "--prompts", str(TINY / "prompts.jsonl")]


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["--kl_controller", "adaptive", "--kl_pi_ki", "0.3"], ["ppo.kl_pi_ki=0.3", "set kl_controller: pi"]),
        (["--kl_controller", "pi", "--kl_horizon", "500"], ["ppo.kl_horizon=500", "set kl_controller: adaptive"]),
        (["--kl_controller", "fixed", "--kl_pi_kp", "0.1"], ["ppo.kl_pi_kp=0.1", "'fixed'"]),
        (["--kl_controller", "pi", "--init_kl_coef", "0"], ["ppo.init_kl_coef=0", "pi KL controller"]),
        (["--kl_controller", "pi", "--kl_pi_ki", "-0.1"], ["ppo.kl_pi_ki=-0.1"]),
        (
            ["--kl_controller", "adaptive", "--kl_pi_integral_min", "0"],
            ["ppo.kl_pi_integral_min=0", "set kl_controller: pi"],
        ),
        (["--kl_controller", "pi", "--kl_pi_integral_min", "0.5"], ["ppo.kl_pi_integral_min=0.5", "must be <= 0"]),
    ],
)
def test_options_of_another_controller_are_refused(overrides, words):
    with pytest.raises(ConfigError) as error:
        parse_config(None, [*BASE, *overrides])
    for word in words:
        assert word in str(error.value)


def test_the_pi_controller_with_its_gains_is_accepted():
    config = parse_config(
        None, [*BASE, "--kl_controller", "pi", "--kl_target", "4", "--kl_pi_kp", "0.3", "--kl_pi_ki", "0.1"]
    )
    assert (config.ppo.kl_controller, config.ppo.kl_target, config.ppo.kl_pi_kp, config.ppo.kl_pi_ki) == (
        "pi",
        4.0,
        0.3,
        0.1,
    )


def test_overlong_buffer_longer_than_the_token_limit_is_refused():
    with pytest.raises(ConfigError, match=r"reward.overlong_buffer=40.*max_new_tokens \(32\)"):
        parse_config(None, [*BASE, "--max_new_tokens", "32", "--overlong_buffer", "40"])
