"""tasks/: data and reward from one place. A reasoning-gym task (tasks/reasoning_gym.py) makes a
run's prompts (its questions) and its reward (its own verifier, rewards/reasoning_gym.py); the
config's `task:` section (config/task.py) or `PPOTrainer(task=ReasoningGymTask(...))` names it."""

from .reasoning_gym import ReasoningGymTask

__all__ = ["ReasoningGymTask"]
