"""Shared test set-up. The folder of this file is put on sys.path so that a test in any
subfolder (tests/model, tests/train, ...) imports the shared helpers (`tiny`, `processes`)
by their bare names."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
