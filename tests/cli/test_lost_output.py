"""`hydrappo train ... 2>&1 | tee log` and Ctrl-C: the reader of the command's output dies with
the SIGINT. The run must still finish its step, save it and stop as Ctrl-C promises (exit 130),
and leave its folder free for `--resume`: a real child process whose stdout and stderr pipes are
closed, then SIGINT."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hydrappo.storage.checkpoint import checkpoint_dirs
from hydrappo.storage.rundir import LOCK_NAME

from runs import ROOT, TINY


def steps_logged(out) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_ctrl_c_after_the_output_pipe_closed_saves_the_step_and_stops(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hydrappo",
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(out),
            "--total_steps",
            "500",
            "--save_every",
            "1000",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "8",
            "--ppo_epochs",
            "1",
            "--max_new_tokens",
            "4",
        ],  # the progress bar on: it writes at every step
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 240
        while len(steps_logged(out)) < 2:  # training, and writing to the pipe
            assert child.poll() is None and time.monotonic() < deadline, child.stdout.read().decode()[-3000:]
            time.sleep(0.2)
        child.stdout.close()  # tee is gone
        time.sleep(1.0)  # a write or two into the closed pipe
        child.send_signal(signal.SIGINT)
        code = child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    last = steps_logged(out)[-1]
    assert code == 130, (code, last)
    assert [p.name for p in checkpoint_dirs(out)] == [f"checkpoint-{last}"]  # the step it logged is saved
    fd = os.open(out / LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody holds the run lock
    finally:
        os.close(fd)
