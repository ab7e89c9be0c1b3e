"""rewards/: the one home of reward sources.

- sources.py: the interface, `RewardSources` (the weighted sum, returning `RewardScores`: the total
  and each source's own scores) and `build_reward_source`, from the config's reward options.
- functions.py: a user's reward function (`FunctionReward`): its loading, calling convention and
  column checks.
- models.py: a classifier model of its own (`ClassifierReward`) and the hydra's reward branch
  (`BranchReward`).
- calls.py: the arguments of one call (a completion as text), and what a failing call's message names.
- context.py: what TRL's reward contract adds (`RewardContext`: trainer_state, log_metric,
  log_extra).
- scores.py: what a source returns, made (B,) scores.

The stage that TRAINS the reward branch on preference pairs is train/reward_model.py.
"""

from ..errors import RewardError, RewardFunctionError
from .calls import completion_text, is_missing
from .context import RewardContext, with_columns
from .functions import FunctionReward, callable_name, callable_spec, load_reward_function, reward_functions
from .models import BranchReward, ClassifierReward
from .sources import SOURCE_CLASSES, RewardScores, RewardSources, build_reward_source

__all__ = [
    "SOURCE_CLASSES",
    "BranchReward",
    "ClassifierReward",
    "FunctionReward",
    "RewardContext",
    "RewardError",
    "RewardFunctionError",
    "RewardScores",
    "RewardSources",
    "build_reward_source",
    "callable_name",
    "callable_spec",
    "completion_text",
    "is_missing",
    "load_reward_function",
    "reward_functions",
    "with_columns",
]
