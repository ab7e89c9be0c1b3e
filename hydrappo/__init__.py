"""hydrappo: PPO for RLHF of Hugging Face causal LMs with policy, reference, critic and
reward model on one transformer trunk."""

from .heads import RewardHead, ValueHead
from .hydra import HydraModel, HydraOutput, RewardBranch

__version__ = "0.1.0"

__all__ = ["HydraModel", "HydraOutput", "RewardBranch", "RewardHead", "ValueHead", "__version__"]
