"""What one PPO step runs, decided once at its start (PPOTrainer.step_plan) from the options, the
KL coefficient and the step count, instead of tested again wherever it matters: whether the
reference branch runs, where the KL goes, whether a critic trains and whether it trains alone,
whether the update needs the policy's entropy."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import PPOArgs


@dataclass(frozen=True)
class StepPlan:
    kl_coef: float  # the KL controller's coefficient for this step
    reference: bool  # the reference branch runs and the KL is measured; a coefficient of 0 skips both
    kl_in_reward: bool  # the KL penalty shapes the per-token rewards (ppo.kl_penalty: reward)
    loss_kl_coef: float  # the KL term's coefficient in the loss: kl_coef with ppo.kl_penalty: loss, else 0
    critic: bool  # a value head: values, returns, the value loss and its statistics
    critic_only: bool  # the critic warms up (ppo.critic_warmup_steps): only the value head steps
    entropy_bonus: bool  # the loss has an entropy term (ppo.ent_coef), so the update computes the entropy

    @classmethod
    def for_step(cls, ppo: PPOArgs, kl_coef: float, steps_done: int) -> StepPlan:
        """The plan of the step after `steps_done` steps, at the KL coefficient `kl_coef`."""
        return cls(
            kl_coef=kl_coef,
            reference=kl_coef != 0,
            kl_in_reward=ppo.kl_penalty == "reward",
            loss_kl_coef=kl_coef if ppo.kl_penalty == "loss" else 0.0,
            critic=ppo.uses_critic,
            critic_only=steps_done < ppo.critic_warmup_steps,
            entropy_bonus=ppo.ent_coef != 0,
        )
