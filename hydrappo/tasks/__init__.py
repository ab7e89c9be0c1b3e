"""tasks/: data and reward from one place, for every task library behind one interface.

- base.py: what a run asks of a task (`Task`): its items per split (`rows`, with its `columns`), its
  prompts as a tokenizer formats them (`prompt_set`, never cut: `fit_prompt_length`), its verifiers
  as reward sources (`reward_sources`, sharing the task's one weight), its held-out scoring
  (`held_out`, `names`), built from the config's `task:` section (`from_args`) and written back into
  it (`configure`); and `Verifier`, a task's scores in TRL's convention.
- registry.py: the libraries a run can name (task.task_library), one line each, imported when named,
  and `task_from_args`, the one function the run (train/inputs.py) and `hydrappo generate` /
  `compare` (evaluation/compare.py) build a task with.
- reasoning_gym.py: reasoning-gym's tasks (`ReasoningGymTask`) and their own verifier (`TaskVerifier`).

The config's `task:` section (config/task.py) or `PPOTrainer(task=ReasoningGymTask(...))` names a task.
"""

from .base import Task, TaskReward, Verifier
from .registry import LIBRARIES, task_class, task_from_args

__all__ = ["LIBRARIES", "ReasoningGymTask", "Task", "TaskReward", "Verifier", "task_class", "task_from_args"]


def __getattr__(name: str):
    """`from hydrappo.tasks import ReasoningGymTask`, imported when asked for (as the registry imports it)."""
    if name == "ReasoningGymTask":
        from .reasoning_gym import ReasoningGymTask

        return ReasoningGymTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
