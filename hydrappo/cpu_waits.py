"""How torch's CPU threads wait for each other, chosen before torch starts its thread pool.

torch's CPU wheels run their parallel loops on GNU OpenMP (libgomp: `torch.__config__.parallel_info()`
says "ATen parallel backend: OpenMP", and torch/lib holds libgomp.so.1). At the end of each parallel
loop a libgomp thread that has finished its share spins (GOMP_SPINCOUNT = 300000 turns by default)
before it sleeps. On a quiet machine that saves a wake-up; on one where another process keeps a core
busy, the spinning threads hold the cores the late thread needs, and a step takes many times longer
(tools/bench_busy_cpu.py measures both; docs/troubleshooting.md has the numbers).

`OMP_WAIT_POLICY=PASSIVE` makes a waiting thread sleep at once (GOMP_SPINCOUNT 0 in libgomp; Intel's
and LLVM's OpenMP runtimes read the same variable). The runtime reads its environment once, when it
loads with torch, so hydrappo/__init__.py calls `choose_waits()` before anything imports torch, and
only where the user has set none of the variables that say how threads wait. The thread count stays
torch's (one per physical core, or OMP_NUM_THREADS).
"""

from __future__ import annotations

import os
import sys

# hydrappo's choice, where the user has made none.
WAITS = {"OMP_WAIT_POLICY": "PASSIVE"}
# Every variable that says how OpenMP threads wait: one set by the user means they chose.
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")

_chosen: dict[str, str] = {}  # what choose_waits set in this process


def choose_waits(environ=None) -> dict[str, str]:
    """Set WAITS in `environ` (os.environ) unless one of WAIT_VARIABLES is already there, or torch is
    already imported (its OpenMP runtime has read the environment: setting them now would only
    mislead). Returns what it set."""
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules or any(name in environ for name in WAIT_VARIABLES):
        return {}
    environ.update(WAITS)
    if environ is os.environ:
        _chosen.update(WAITS)
    return dict(WAITS)


def describe() -> str:
    """One line for the start of a run: torch's thread count and how its threads wait, and whose choice that is."""
    import torch

    given = [name for name in WAIT_VARIABLES if name in os.environ]
    waits = ", ".join(f"{name}={os.environ[name]}" for name in given) or "the OpenMP runtime's defaults"
    whose = "hydrappo's default" if given and all(name in _chosen for name in given) else "as set before the run"
    return (
        f"CPU: {torch.get_num_threads()} threads, waiting with {waits} ({whose}; docs/troubleshooting.md "
        "says how to change it)"
    )
