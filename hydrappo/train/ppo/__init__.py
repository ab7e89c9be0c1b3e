"""train/ppo/: the PPO algorithm's room (critic-free estimators included).

    trainer.py      PPOTrainer: builds the step from the run's objects, runs it with the harness,
                    evaluates on held-out prompts, keeps what a checkpoint keeps
    step.py         PPOStep: one PPO iteration top to bottom (sample, score, shape, update, log),
                    an object that receives everything it reads in its constructor
    experience.py   the batch the update reads, and its minibatches
    step_plan.py    what one step runs, decided once at its start
    update_meter.py the update's statistics

The run's infrastructure (the harness, processes, precision, optimizers, interrupts, logs) is
train/'s, shared with the reward-model and SFT stages.
"""

from .trainer import PPOTrainer

__all__ = ["PPOTrainer"]
