"""The code stays as ruff formats and lints it (the rules are pyproject.toml's), so that no module
is squeezed by hand and a diff shows only what changed."""

import shutil
import subprocess
import sys

import pytest

from runs import ROOT

TREES = ["hydrappo", "tests", "tools", "examples"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ruff"] if shutil.which("ruff") is None else ["ruff"]
    return subprocess.run([*command, *args, *TREES], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module", autouse=True)
def ruff_installed():
    try:
        import ruff  # noqa: F401
    except ImportError:
        pytest.fail("ruff is not installed: pip install -e '.[test]' brings it")


def test_ruff_format_leaves_every_file_as_it_is():
    result = ruff("format", "--check")
    assert result.returncode == 0, f"run `ruff format {' '.join(TREES)}`:\n{result.stdout}{result.stderr}"


def test_ruff_check_passes():
    result = ruff("check")
    assert result.returncode == 0, f"run `ruff check {' '.join(TREES)}` and fix what it says:\n{result.stdout}"
