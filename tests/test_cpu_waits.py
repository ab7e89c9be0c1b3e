"""hydrappo chooses how torch's OpenMP threads wait before torch loads them (hydrappo/__init__.py):
passive waits, where the user set none of the variables that say how. Checked in fresh processes
through the runtime's own report of what it read (OMP_DISPLAY_ENV), so a choice made too late,
after torch loaded its runtime, fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import hydrappo
from hydrappo.train import run_log

from runs import ROOT


def _runtime_report(**env) -> str:
    """What the OpenMP runtime of a fresh `python -m hydrappo --help` read from its environment."""
    clean = {k: v for k, v in os.environ.items() if k not in hydrappo.CPU_WAIT_VARIABLES}
    clean.update(env, OMP_DISPLAY_ENV="VERBOSE", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "hydrappo", "--help"], env=clean, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    if "OPENMP DISPLAY ENVIRONMENT" not in done.stderr:
        pytest.skip("this torch's OpenMP runtime does not report its environment (OMP_DISPLAY_ENV)")
    return done.stderr


def test_a_fresh_hydrappo_waits_passively_when_the_user_chose_nothing():
    report = _runtime_report()
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in report
    if "GOMP_SPINCOUNT" in report:  # GNU OpenMP (torch's CPU wheels): no spinning at all
        assert "GOMP_SPINCOUNT = '0'" in report


@pytest.mark.parametrize(
    "env, shown",
    [
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "OMP_WAIT_POLICY = 'ACTIVE'"),
        ({"GOMP_SPINCOUNT": "1234"}, "GOMP_SPINCOUNT = '1234'"),
    ],
)
def test_the_users_own_wait_settings_are_left_alone(env, shown):
    report = _runtime_report(**env)
    if "GOMP_SPINCOUNT" in env and "GOMP_SPINCOUNT" not in report:
        pytest.skip("not GNU OpenMP")
    assert shown in report


def test_choose_cpu_waits_sets_only_what_nobody_chose(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")  # as before torch's first import (monkeypatch puts it back)
    assert hydrappo.choose_cpu_waits(environ := {}) == hydrappo.CPU_WAITS and environ == hydrappo.CPU_WAITS
    for name in hydrappo.CPU_WAIT_VARIABLES:
        assert hydrappo.choose_cpu_waits(environ := {name: "1"}) == {} and environ == {name: "1"}


def test_too_late_when_torch_is_loaded():
    assert "torch" in sys.modules
    assert hydrappo.choose_cpu_waits(environ := {}) == {} and environ == {}


def test_a_run_starts_by_logging_its_threads_and_how_they_wait(tmp_path, caplog, monkeypatch):
    assert run_log.WAIT_VARIABLES == hydrappo.CPU_WAIT_VARIABLES  # one list, written twice across a layer
    for name in hydrappo.CPU_WAIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert "OpenMP waits: the runtime defaults (" in run_log.cpu_threads_line()
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "10")
    loop, run = SimpleNamespace(name="ppo", progress={}), SimpleNamespace(progress_bar=False)
    with caplog.at_level("INFO", logger="hydrappo"):
        run_log.RunLog(tmp_path, 0, 1, loop, run).close()
    line = f"CPU: {torch.get_num_threads()} threads, OpenMP waits: OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=10 ("
    assert line in caplog.text and "docs/troubleshooting.md says how to change it" in caplog.text
