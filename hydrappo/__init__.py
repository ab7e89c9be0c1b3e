"""hydrappo: RLHF of Hugging Face causal LMs with policy, reference, critic and reward model
on one transformer trunk.

    from hydrappo import HydraModel, PPOTrainer, Config

The trainers are imported on first use, so `import hydrappo` (or any of its lower layers)
does not pull in the training loops.
"""

import os
import sys

# How torch's CPU threads wait for each other, chosen here because the OpenMP runtime reads it from
# the environment once, when it loads with torch. torch's CPU wheels use GNU OpenMP (libgomp:
# `torch.__config__.parallel_info()`), whose threads spin (GOMP_SPINCOUNT 300000 turns) at the end
# of each parallel loop before they sleep: on a CPU where another process keeps a core busy, the
# spinning threads hold the cores the late thread needs, and steps take many times longer
# (docs/troubleshooting.md). PASSIVE makes them sleep at once (libgomp's spin count 0; Intel's and
# LLVM's runtimes read the same variable).
CPU_WAITS = {"OMP_WAIT_POLICY": "PASSIVE"}
# The variables that say how OpenMP threads wait: one the user set means they chose.
CPU_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def choose_cpu_waits(environ=None) -> dict:
    """Put CPU_WAITS into `environ` (os.environ) unless one of CPU_WAIT_VARIABLES is there, or torch
    is imported already (its runtime has read the environment: setting them would only mislead).
    Returns what it set."""
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules or any(name in environ for name in CPU_WAIT_VARIABLES):
        return {}
    environ.update(CPU_WAITS)
    return dict(CPU_WAITS)


choose_cpu_waits()  # before the imports below load torch

from .model import HydraModel, HydraOutput, RewardBranch, RewardHead, ValueHead  # noqa: E402

__version__ = "0.1.0"

# name -> module, imported on first use
_LAZY = {
    "PPOTrainer": ".train.ppo",
    "RewardTrainer": ".train.reward_model",
    "SFTTrainer": ".train.sft",
    "DPOTrainer": ".train.dpo",
    "Config": ".config",
    "RewardConfig": ".config",
    "SFTConfig": ".config",
    "DPOConfig": ".config",
}

__all__ = ["HydraModel", "HydraOutput", "RewardBranch", "RewardHead", "ValueHead", *_LAZY, "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'hydrappo' has no attribute {name!r}")
