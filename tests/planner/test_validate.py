"""`hydrappo memory --validate` runs the package's own validation (planner/validate.py), so it works
from an installed package; its measuring child is a package module too (train/measured_memory.py)."""

import importlib.util
from pathlib import Path

import pytest

import hydrappo
from hydrappo.cli import main as cli_main
from hydrappo.planner import validate

PACKAGE = Path(hydrappo.__file__).resolve().parent


def test_memory_validate_calls_the_package_s_validation(monkeypatch):
    calls = []
    monkeypatch.setattr(validate, "main", lambda argv: calls.append(argv) or 0)
    assert cli_main(["memory", "--validate"]) == 0
    assert calls == [[]]  # the defaults: both models, the three settings


def test_the_validation_and_its_child_are_modules_of_the_package(capsys):
    child = importlib.util.find_spec(validate.MEASURING_CHILD)
    assert child is not None and Path(child.origin).resolve().is_relative_to(PACKAGE)
    assert Path(validate.__file__).resolve().is_relative_to(PACKAGE)
    with pytest.raises(SystemExit) as done:
        validate.main(["--help"])
    assert done.value.code == 0 and "usage: python -m hydrappo.planner.validate" in capsys.readouterr().out


@pytest.mark.slow
def test_the_measuring_child_measures_two_steps_of_a_tiny_model():
    """The runtime probe (~0.1M parameters) through the child process, as --validate measures it."""
    measured = validate.measure(validate.RUNTIME_PROBE, validate.validation_settings())
    assert measured["peak"] > 0 and measured["build"] > 0
    if validate.reset_peak():  # Linux: the second step's phases are measured one by one
        assert set(measured["phases"]) == {"generate", "evaluate", "update"}
        assert measured["peak"] == max(measured["peak"], *measured["phases"].values())
