"""Start K processes of a python command the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT in the environment), wait for them all, and never leave one behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from runs import ROOT


@dataclass
class Finished:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(args: list[str], nprocs: int = 2, timeout: float = 90.0, cwd: Path | None = None) -> list[Finished]:
    """Run `python ARGS` as `nprocs` processes of one torch.distributed run on this machine
    (gloo on the CPU, one thread each). Output goes to files, not pipes, so that a process
    that writes a lot never blocks the others. Past `timeout` seconds every process still
    running is killed and the test fails with what they printed."""
    path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "tests" / "helpers"), os.environ.get("PYTHONPATH")) if p)
    common = {
        **os.environ,
        "PYTHONPATH": path,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    with tempfile.TemporaryDirectory() as logs:
        processes, files = [], []
        try:
            for rank in range(nprocs):
                out, err = open(Path(logs) / f"{rank}.out", "w+"), open(Path(logs) / f"{rank}.err", "w+")
                files.append((out, err))
                env = {**common, "RANK": str(rank), "LOCAL_RANK": str(rank)}
                processes.append(
                    subprocess.Popen([sys.executable, *args], env=env, stdout=out, stderr=err, cwd=cwd or ROOT)
                )
            deadline = time.monotonic() + timeout
            timed_out = False
            for process in processes:
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        results = []
        for rank, (process, (out, err)) in enumerate(zip(processes, files)):
            out.seek(0)
            err.seek(0)
            results.append(Finished(rank, process.returncode, out.read(), err.read()))
            out.close()
            err.close()
    if timed_out:
        raise AssertionError(f"{nprocs} processes still running after {timeout} s:\n" + describe(results))
    return results


def describe(results: list[Finished]) -> str:
    return "\n".join(
        f"--- process {r.rank}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}" for r in results
    )


def check_ok(results: list[Finished]) -> None:
    assert all(r.returncode == 0 for r in results), describe(results)
