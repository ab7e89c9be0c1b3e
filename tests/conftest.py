"""Shared test set-up. The folder of this file is put on sys.path so that a test in any
subfolder (tests/model, tests/train, ...) imports the shared helpers by their bare names:

    tiny.py        tiny random models and tokenizers of every family (tiny_model, tiny_tokenizer, FAMILIES)
    runs.py        runs on examples/tiny: tiny_trainer, reward_config, write_sft_config, and the ways a
                   test kills a run before resuming it (kill_after_next_save, kill_during_step)
    recorded.py    sampling with recorded split states and the two experience passes over it
    processes.py   launching K processes the way torchrun does
    bounds.py      the float64 bound for two training runs that must end with the same weights

Tests that train, launch processes or convert a real model are marked `slow` (registered in
setup.cfg): `python -m pytest -m "not slow"` is the quick loop, `python -m pytest -q` runs all."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The tests never reach the network: a Hub id a test names resolves from a cache the test built,
# or fails at once. Set before huggingface_hub is imported (it reads this at import).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
