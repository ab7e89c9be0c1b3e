"""THE IDEA: one transformer trunk holding policy, reference, critic and reward model.

Imports torch, transformers and peft only (and hydrappo.errors)."""

from .heads import RewardHead, ValueHead
from .hydra import HydraModel, HydraOutput
from .reward_branch import RewardBranch

__all__ = ["HydraModel", "HydraOutput", "RewardBranch", "RewardHead", "ValueHead"]
