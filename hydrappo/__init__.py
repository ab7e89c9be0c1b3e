"""hydrappo: RLHF of Hugging Face causal LMs with policy, reference, critic and reward model
on one transformer trunk.

    from hydrappo import HydraModel, PPOTrainer

The trainers are imported on first use, so `import hydrappo` (or any of its lower layers)
does not pull in the training loops.
"""

from .model import HydraModel, HydraOutput, RewardBranch, RewardHead, ValueHead

__version__ = "0.1.0"

_TRAINERS = {"PPOTrainer": "ppo", "RewardTrainer": "reward", "SFTTrainer": "sft"}

__all__ = ["HydraModel", "HydraOutput", "RewardBranch", "RewardHead", "ValueHead", *_TRAINERS, "__version__"]


def __getattr__(name: str):
    if name in _TRAINERS:
        import importlib

        return getattr(importlib.import_module(f".train.{_TRAINERS[name]}", __name__), name)
    raise AttributeError(f"module 'hydrappo' has no attribute {name!r}")
