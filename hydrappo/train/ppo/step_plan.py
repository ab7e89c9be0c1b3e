"""What one PPO step runs, decided once at its start (PPOTrainer.step_plan) from the options, the
KL coefficient and the step count, instead of tested again wherever it matters: whether the
reference branch runs, where the KL goes and how it is estimated, how the scores are shaped,
whether a critic trains and whether it trains alone, what the loss computes."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ...algo.advantages import ESTIMATORS
from ...algo.losses import PPOLossSettings
from ...config import PPOArgs


# PPOLossSettings' fields the plan sets itself; every other field is the PPOArgs option of its name.
PLANNED_LOSS_FIELDS = ("kl_coef", "kl_estimator")


def loss_options(ppo: PPOArgs) -> dict:
    """The PPO loss's options by field name, so that a new loss option is a PPOLossSettings field and a
    PPOArgs option of the same name (algo/losses.py, config/), and nothing here."""
    return {f.name: getattr(ppo, f.name) for f in fields(PPOLossSettings) if f.name not in PLANNED_LOSS_FIELDS}


@dataclass(frozen=True)
class StepPlan:
    kl_coef: float  # the KL controller's coefficient for this step
    reference: bool  # the reference branch runs and the KL is measured; a coefficient of 0 skips both (unless measured)
    kl_in_reward: bool  # the KL penalty shapes the per-token rewards (ppo.kl_penalty: reward)
    kl_estimator: str  # the per-token KL estimate of the reward's penalty (ppo.kl_estimator)
    group_size: int  # samples of one prompt, in consecutive rows (generation.samples_per_prompt)
    group_baseline: int  # G: each group's mean score is subtracted before shaping (the estimator's), else 0
    mask_truncated: bool  # responses cut at max_new_tokens add nothing to the loss (DAPO's overlong filtering)
    critic: bool  # a value head: values, returns, the value loss and its statistics
    critic_only: bool  # the critic warms up (ppo.critic_warmup_steps): only the value head steps
    entropy_bonus: bool  # the loss has an entropy term (ppo.ent_coef), so the update computes the entropy
    loss: PPOLossSettings  # every minibatch's loss; its KL term's coefficient is kl_coef with ppo.kl_penalty: loss

    @classmethod
    def for_step(cls, ppo: PPOArgs, group_size: int, kl_coef: float, steps_done: int) -> StepPlan:
        """The plan of the step after `steps_done` steps, at the KL coefficient `kl_coef`, for
        groups of `group_size` samples per prompt."""
        return cls(
            kl_coef=kl_coef,
            reference=kl_coef != 0 or ppo.measure_kl,
            kl_in_reward=ppo.kl_penalty == "reward",
            kl_estimator=ppo.kl_estimator,
            group_size=group_size,
            group_baseline=group_size if ESTIMATORS[ppo.advantage_estimator].baseline_on_scores else 0,
            mask_truncated=ppo.mask_truncated,
            critic=ppo.uses_critic,
            critic_only=steps_done < ppo.critic_warmup_steps,
            entropy_bonus=ppo.ent_coef != 0,
            loss=PPOLossSettings(
                **loss_options(ppo),
                # The loss's KL term is always the k3 estimate (ppo.kl_estimator is the reward's).
                kl_coef=kl_coef if ppo.kl_penalty == "loss" else 0.0,
            ),
        )
