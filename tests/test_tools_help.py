"""Every script in tools/ answers --help with its usage and exit status 0, without running
anything: a benchmark or a study that starts on `--help` (or fails on it) is a bug.

Most scripts import torch before they parse their arguments (a few seconds each), so they run
a few at a time, each in its own process, in a scratch folder (a script that writes where it
runs writes there)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from runs import ROOT

TOOLS = sorted((ROOT / "tools").glob("*.py"))
TIMEOUT_S = 120
AT_ONCE = min(4, os.cpu_count() or 1)


def help_problem(script, scratch) -> str | None:
    """What is wrong with `python SCRIPT --help`, or None when it printed a usage and exited 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run(
            [sys.executable, str(script), "--help"],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"still running after {TIMEOUT_S} s: --help must not start the work"
    if done.returncode != 0 or "usage" not in done.stdout.lower():
        return f"exit {done.returncode}; stdout {done.stdout[-300:]!r}; stderr {done.stderr[-500:]!r}"
    return None


@pytest.mark.slow
def test_every_tool_answers_help(tmp_path):
    assert TOOLS, "no tools/*.py found"
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        problems = dict(zip((s.name for s in TOOLS), pool.map(lambda s: help_problem(s, tmp_path), TOOLS)))
    failed = {name: problem for name, problem in problems.items() if problem}
    assert not failed, "tools that do not answer --help:\n" + "\n".join(f"  {k}: {v}" for k, v in failed.items())
