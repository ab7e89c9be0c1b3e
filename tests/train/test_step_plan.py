"""StepPlan builds the PPO loss's settings from PPOArgs by field name (train/ppo/step_plan.py)."""

from dataclasses import fields, replace

from hydrappo.algo.losses import PPOLossSettings
from hydrappo.config import PPOArgs
from hydrappo.train.ppo.step_plan import PLANNED_LOSS_FIELDS, StepPlan


def test_every_loss_setting_is_the_ppo_option_of_its_name():
    ppo = replace(PPOArgs(), cliprange=0.13, cliprange_high=0.31, vf_coef=0.7, ent_coef=0.01, dual_clip=3.0)
    loss = StepPlan.for_step(ppo, group_size=1, kl_coef=0.05, steps_done=0).loss
    for field in fields(PPOLossSettings):
        if field.name not in PLANNED_LOSS_FIELDS:
            assert getattr(loss, field.name) == getattr(ppo, field.name), field.name
    assert (loss.cliprange, loss.cliprange_high, loss.vf_coef, loss.dual_clip) == (0.13, 0.31, 0.7, 3.0)


def test_the_loss_s_kl_term_is_the_plan_s():
    reward_side = StepPlan.for_step(replace(PPOArgs(), kl_penalty="reward"), 1, kl_coef=0.05, steps_done=0)
    loss_side = StepPlan.for_step(replace(PPOArgs(), kl_penalty="loss", kl_estimator="k1"), 1, 0.05, 0)
    assert reward_side.loss.kl_coef == 0.0 and loss_side.loss.kl_coef == 0.05
    assert loss_side.loss.kl_estimator == "k3"  # the loss's KL term is k3 whatever the reward's estimator
