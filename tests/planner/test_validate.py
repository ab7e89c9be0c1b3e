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
    if not validate.peak_counters_work():
        pytest.skip("this system does not report the peak resident size: --validate says so and stops")
    # This process holds 1 GiB while its child measures: Linux carries a parent's peak into its child
    # through fork and exec (getrusage's ru_maxrss), and the child's own peak must not read it.
    held = b"\x01" * 2**30
    measured = validate.measure(validate.RUNTIME_PROBE, validate.validation_settings())
    del held
    assert measured["peak"] > 0 and measured["build"] > 0
    if validate.reset_peak():  # Linux: the second step's phases are measured one by one
        assert set(measured["phases"]) == {"generate", "evaluate", "update"}
        assert measured["peak"] == max(measured["peak"], *measured["phases"].values())


def test_validate_stops_with_a_clear_error_where_the_system_reports_no_peak(monkeypatch, capsys):
    monkeypatch.setattr(validate, "peak_counters_work", lambda: False)
    assert validate.main(["--variants", "none/adamw"]) == 2
    assert "does not report the peak resident size" in capsys.readouterr().err


def test_the_counter_check_sees_a_written_block_in_the_peak():
    if not Path("/proc/self/statm").exists():
        pytest.skip("no /proc: not Linux")
    # On a plain Linux kernel ru_maxrss is at least what is resident; the check must say so.
    assert validate.peak_counters_work() == (validate.peak_rss_bytes() >= 0.9 * validate.resident_bytes())
