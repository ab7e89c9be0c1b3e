"""Every script in tools/ and tools/lab/ answers --help with its usage and exit status 0, without
running anything: a benchmark or a study that starts on `--help` (or fails on it) is a bug.

Each script reads its arguments before it imports torch, transformers or hydrappo (whose package
loads torch), so --help takes a fraction of a second: importing torch and transformers took
~240 s for the scripts together on a loaded CI machine. `python -X importtime` lists what a
script imported, and one that loads them for --help fails here. They run a few at a time, each
in its own process, in a scratch folder (a script that writes where it runs writes there)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from runs import ROOT

TOOLS = sorted([*(ROOT / "tools").glob("*.py"), *(ROOT / "tools" / "lab").glob("*.py")])
TIMEOUT_S = 120
HEAVY = ("torch", "transformers", "hydrappo")  # hydrappo/__init__.py imports torch
AT_ONCE = min(4, os.cpu_count() or 1)


def help_problem(script, scratch) -> str | None:
    """What is wrong with `python SCRIPT --help`, or None when it printed a usage and exited 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run(
            [sys.executable, "-X", "importtime", str(script), "--help"],
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
    heavy = sorted(set(HEAVY) & imported(done.stderr))
    if heavy:
        return f"imports {', '.join(heavy)} for --help: read the arguments first, import them after"
    return None


def imported(importtime: str) -> set[str]:
    """The modules `python -X importtime` reported (its lines end with `| module.name`)."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime.splitlines() if line.startswith("import time:")}


@pytest.mark.slow
def test_every_tool_answers_help(tmp_path):
    assert {s.parent.name for s in TOOLS} == {"tools", "lab"}, "no tools/*.py or tools/lab/*.py found"
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        problems = dict(
            zip((s.relative_to(ROOT).as_posix() for s in TOOLS), pool.map(lambda s: help_problem(s, tmp_path), TOOLS))
        )
    failed = {name: problem for name, problem in problems.items() if problem}
    assert not failed, "tools that do not answer --help:\n" + "\n".join(f"  {k}: {v}" for k, v in failed.items())
