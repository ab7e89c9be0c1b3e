"""hydrappo chooses how torch's OpenMP threads wait before torch loads them (hydrappo/cpu_waits.py):
passive waits, where the user set none of the variables that say how. Checked in fresh processes
through the runtime's own report of what it read (OMP_DISPLAY_ENV), so a choice made too late,
after torch loaded its runtime, fails here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hydrappo import cpu_waits

from runs import ROOT


def _runtime_report(**env) -> str:
    """What the OpenMP runtime of a fresh `python -m hydrappo --help` read from its environment."""
    clean = {k: v for k, v in os.environ.items() if k not in cpu_waits.WAIT_VARIABLES}
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


def test_choose_waits_sets_only_what_nobody_chose(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")  # as before torch's first import (monkeypatch puts it back)
    assert cpu_waits.choose_waits(environ := {}) == cpu_waits.WAITS and environ == cpu_waits.WAITS
    for name in cpu_waits.WAIT_VARIABLES:
        assert cpu_waits.choose_waits(environ := {name: "1"}) == {} and environ == {name: "1"}


def test_too_late_when_torch_is_loaded():
    assert "torch" in sys.modules
    assert cpu_waits.choose_waits(environ := {}) == {} and environ == {}


def test_the_run_start_line_says_whose_choice_it_is(monkeypatch):
    import torch

    for name in cpu_waits.WAIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert "waiting with the OpenMP runtime's defaults" in cpu_waits.describe()
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(cpu_waits, "_chosen", {"OMP_WAIT_POLICY": "PASSIVE"})
    line = cpu_waits.describe()
    assert line.startswith(f"CPU: {torch.get_num_threads()} threads, waiting with OMP_WAIT_POLICY=PASSIVE")
    assert "(hydrappo's default; docs/troubleshooting.md" in line
    monkeypatch.setattr(cpu_waits, "_chosen", {})
    assert "(as set before the run;" in cpu_waits.describe()


def test_a_run_starts_by_logging_how_its_threads_wait(tmp_path, caplog):
    from types import SimpleNamespace

    from hydrappo.train.run_log import RunLog

    loop, run = SimpleNamespace(name="ppo", progress={}), SimpleNamespace(progress_bar=False)
    with caplog.at_level("INFO", logger="hydrappo"):
        RunLog(tmp_path, 0, 1, loop, run).close()
    assert cpu_waits.describe() in caplog.text
