"""One run per output folder, enforced by an OS lock (storage/rundir.py): two runs started at
the same moment into one new folder, one trains and the other is refused naming the holder; a
lock left by a process that died does not block --resume."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hydrappo.cli import main
from hydrappo.storage.rundir import (
    LOCK_NAME,
    OutputDirError,
    claim_output_dir,
    lock_output_dir,
    name_lock_holder,
    release_output_dir,
)

from runs import FAST_SMALL, ROOT, TINY

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def hold_lock(folder: Path) -> subprocess.Popen:
    """A process that takes the lock of `folder`, says so, and sleeps until killed."""
    code = (
        "import sys, time\nfrom hydrappo.storage.rundir import lock_output_dir, name_lock_holder\n"
        f"lock_output_dir({str(folder)!r})\nname_lock_holder({str(folder)!r})\nprint('locked', flush=True)\ntime.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


def test_a_folder_locked_by_another_process_is_refused_naming_the_holder(tmp_path):
    holder = hold_lock(tmp_path / "run")
    try:
        with pytest.raises(OutputDirError) as error:
            lock_output_dir(tmp_path / "run")
        message = str(error.value)
        assert f"is in use by another run (host {socket.gethostname()}, PID {holder.pid}, started " in message
        assert "choose another output_dir" in message
    finally:
        holder.kill()
        holder.wait()
    # Killed, it holds nothing: the lock file it leaves is no obstacle.
    assert (tmp_path / "run" / LOCK_NAME).is_file()
    lock_output_dir(tmp_path / "run")
    name_lock_holder(tmp_path / "run")
    assert f"PID {os.getpid()}," in (tmp_path / "run" / LOCK_NAME).read_text()
    lock_output_dir(tmp_path / "run")  # this process again: the same run claiming twice
    release_output_dir(tmp_path / "run")


HOLDER_LINE = re.compile(r"host [^,\s]+, PID \d+, started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S*\n")


def try_lock_elsewhere(folder: Path) -> str:
    """What another process is told when it tries to lock `folder`."""
    code = (
        f"from hydrappo.storage.rundir import lock_output_dir\ntry:\n    lock_output_dir({str(folder)!r})\n"
        "except Exception as error:\n    print(error)\n"
    )
    return subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60).stdout


def test_a_folder_claimed_twice_by_its_run_names_the_holder_in_one_clean_line(tmp_path):
    # The command line claims the folder before the model loads, and the harness again when it
    # starts the run: each names the holder, and the second naming replaces the first.
    out = tmp_path / "out"
    claim_output_dir(out)
    claim_output_dir(out)
    try:
        text = (out / LOCK_NAME).read_bytes().decode()
        assert HOLDER_LINE.fullmatch(text) and f"PID {os.getpid()}," in text, repr(text)
        refused = try_lock_elsewhere(out)
        assert f"is in use by another run (host {socket.gethostname()}, PID {os.getpid()}, started " in refused, refused
        assert "\0" not in refused
    finally:
        release_output_dir(out)


@pytest.mark.slow
def test_a_cli_run_leaves_a_lock_file_of_one_clean_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["train", str(TINY / "config.yaml"), "--output_dir", str(out), *FAST_SMALL]) == 0
    text = (out / LOCK_NAME).read_bytes().decode()
    assert HOLDER_LINE.fullmatch(text) and f"PID {os.getpid()}," in text, repr(text)


@pytest.mark.slow
def test_two_runs_started_together_into_one_folder_one_trains_and_the_other_is_refused(tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "hydrappo", "train", str(TINY / "config.yaml"), "--output_dir", str(out), *FAST_SMALL]
    runs = [
        subprocess.Popen(argv, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    done = [(run.pid, *run.communicate(timeout=300), run.returncode) for run in runs]
    codes = sorted(code for *_, code in done)
    assert codes == [0, 2], done
    (winner, *_), (_, _, refused, _) = sorted(done, key=lambda d: d[-1])
    assert f"is in use by another run (host {socket.gethostname()}, PID {winner}, started " in refused, refused
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-1"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_a_run_killed_mid_step_leaves_a_lock_that_does_not_block_resume(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "train",
        str(TINY / "config.yaml"),
        "--output_dir",
        str(out),
        *FAST_SMALL,
        "--total_steps",
        "2",
        "--save_every",
        "1",
    ]
    killed = subprocess.run(
        [sys.executable, "tests/helpers/distributed_worker.py", "die-after-first-save", *argv],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == 3, killed.stderr
    assert (out / LOCK_NAME).is_file() and (out / "checkpoint-1").is_dir()
    assert main([*argv, "--resume"]) == 0
    assert "done: step 2" in capsys.readouterr().out
