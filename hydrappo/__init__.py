"""hydrappo: RLHF of Hugging Face causal LMs with policy, reference, critic and reward model
on one transformer trunk.

    from hydrappo import HydraModel, PPOTrainer, Config

The trainers are imported on first use, so `import hydrappo` (or any of its lower layers)
does not pull in the training loops.
"""

# Before anything imports torch: its OpenMP runtime reads how threads wait when it loads (cpu_waits.py).
from .cpu_waits import choose_waits

choose_waits()

from .model import HydraModel, HydraOutput, RewardBranch, RewardHead, ValueHead  # noqa: E402

__version__ = "0.1.0"

# name -> module, imported on first use
_LAZY = {
    "PPOTrainer": ".train.ppo",
    "RewardTrainer": ".train.reward_model",
    "SFTTrainer": ".train.sft",
    "Config": ".config",
    "RewardConfig": ".config",
    "SFTConfig": ".config",
}

__all__ = ["HydraModel", "HydraOutput", "RewardBranch", "RewardHead", "ValueHead", *_LAZY, "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'hydrappo' has no attribute {name!r}")
