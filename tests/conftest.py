"""Shared test set-up. Tests are laid out like the package: tests/test_<module>.py for the
top-level modules (rewards, data, prompts, usercode), a folder per subpackage (tests/model,
algo, config, planner, storage, generation, train), tests/cli for the
commands and tests/e2e for the examples and the README. tests/helpers is put on sys.path, so a
test anywhere imports the shared helpers by their bare names:

    tiny.py                tiny random models of every family and the word-level tokenizer built in
                           code (tiny_model, tiny_tokenizer, FAMILIES; the word-level tokenizer is the
                           package's, hydrappo/planner/tokenizer.py)
    runs.py                the repository's paths (ROOT, TINY, FIXTURES) and runs on examples/tiny:
                           the FAST overrides, tiny_trainer, reward_config, write_sft_config, and
                           the ways a test kills a run before resuming it (kill_after_next_save,
                           kill_during_step)
    recorded.py            sampling with recorded split states and the two experience passes over it
    processes.py           launching K processes the way torchrun does
    distributed_worker.py  what those processes run
    bounds.py              the float64 bound for two training runs that must end with the same weights
    tensors.py             small tensors for the math's tests: close, pad with garbage, masks from lengths

tests/fixtures holds files the tests read: reward functions named by path, old checkpoints.

Tests that train, launch processes or convert a real model are marked `slow` (registered in
setup.cfg): `python -m pytest -m "not slow"` is the quick loop, `python -m pytest -q` runs all.
README's test command runs them in two pytest-xdist workers (`-n 2`); each worker then takes its
share of the machine's cores for torch, not all of them."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

# The tests never reach the network: a Hub id a test names resolves from a cache the test built,
# or fails at once. Set before huggingface_hub is imported (it reads this at import).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Under pytest-xdist every worker is a process of its own: left alone, each would start one
# torch thread per core and the workers would spin against each other on the same cores. The
# processes a test starts inherit the same count through OMP_NUM_THREADS: a run killed in a child
# and resumed in the worker must sum in the same order to end with bit-identical weights.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    THREADS = max(1, (os.cpu_count() or 1) // WORKERS)
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
    import torch

    torch.set_num_threads(THREADS)

HELPERS = str(Path(__file__).resolve().parent / "helpers")
if HELPERS not in sys.path:
    sys.path.insert(0, HELPERS)


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to open a connection or look up a host raises, and is recorded (the list returned)."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts
