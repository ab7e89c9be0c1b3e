"""A run's log: TensorBoard scalars and texts, one JSON line per step in metrics.jsonl, and a
tqdm bar, with the same conventions for every stage (the harness writes it, process 0 only)."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import torch

from ..storage.checkpoint import run_write_errors
from .progress import ProgressBar, samples_markdown

logger = logging.getLogger("hydrappo")


def as_float(value) -> float:
    """A logged value (a tensor of one element, or a number) as a python float."""
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


class RunLog:
    """TensorBoard scalars, one JSON line per step in metrics.jsonl, and a tqdm bar.

    Lines of metrics.jsonl past the step a run starts from belong to an earlier or an
    interrupted run: they are moved to a side file (nothing written is lost), and the
    TensorBoard writer purges its events past that step."""

    def __init__(self, output_dir: Path, start_step: int, total_steps: int, loop, run, write: bool = True):
        """`write=False` (every process but 0 of a distributed run): records only, no files, no bar shown."""
        from torch.utils.tensorboard import SummaryWriter

        self.writes = write
        self.path = output_dir / "metrics.jsonl"
        self.samples_every = getattr(run, "log_samples_every", 0)
        self.num_samples = getattr(run, "num_log_samples", 4)
        self.bar = ProgressBar(loop.name, loop.progress, total_steps, start_step, run.progress_bar and write)
        if not write:
            return
        logger.info("%s", cpu_threads_line())  # a run slowed by a busy CPU shows here how its threads wait
        keep_metrics_up_to(self.path, start_step)
        self.writer = SummaryWriter(str(output_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None)

    def scalars(self, step: int, stats: dict) -> None:
        if not self.writes:
            return
        for key, value in stats.items():
            self.writer.add_scalar(key, as_float(value), step)

    def write(self, step: int, stats: dict, samples: list[dict] | None = None) -> dict:
        record = {"step": step, **{key: as_float(value) for key, value in stats.items()}}
        if not self.writes:
            return record
        self.scalars(step, stats)
        for tag, rows in (samples if isinstance(samples, dict) else {"samples": samples}).items():
            periodic = tag == "samples"  # training samples every log_samples_every steps; evaluations' always
            if rows and (not periodic or (self.samples_every and step % self.samples_every == 0)):
                self.writer.add_text(tag, samples_markdown(rows[: self.num_samples]), step)
        with run_write_errors(f"the metrics of step {step}", self.path):
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        self.bar.show(step, record)
        return record

    def close(self) -> None:
        self.bar.close()
        if self.writes:
            self.writer.close()


# The OpenMP variables that say how torch's CPU threads wait (hydrappo/__init__.py's CPU_WAIT_VARIABLES,
# which this layer may not import).
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def cpu_threads_line() -> str:
    """torch's CPU thread count and how its threads wait, for the start of a run."""
    waits = ", ".join(f"{name}={os.environ[name]}" for name in WAIT_VARIABLES if name in os.environ)
    return (
        f"CPU: {torch.get_num_threads()} threads, OpenMP waits: {waits or 'the runtime defaults'} (hydrappo sets "
        "OMP_WAIT_POLICY=PASSIVE before torch loads where none of these is set; docs/troubleshooting.md says how "
        "to change it)"
    )


def keep_metrics_up_to(path: Path, step: int) -> None:
    """Move the lines of metrics.jsonl logged after `step` to a side file, so that
    metrics.jsonl reads as one run and nothing written is lost."""
    if not path.exists():
        return
    kept, dropped = [], []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        (kept if _metrics_step(line) <= step else dropped).append(line)
    if dropped:
        # A line that does not parse (half-written by a killed run) goes with the dropped ones.
        side = path.with_name(f"metrics.after-step-{step}.{int(time.time())}.jsonl")
        side.write_bytes(b"\n".join(dropped) + b"\n")
        path.write_bytes(b"".join(line + b"\n" for line in kept))
        logger.warning("moved %d metrics lines logged after step %d to %s", len(dropped), step, side.name)


def _metrics_step(line: bytes) -> float:
    """The step of a metrics.jsonl line; infinite for a line that is not a complete record."""
    try:
        record = json.loads(line)
        return float(record.get("step", 0)) if isinstance(record, dict) else math.inf
    except (ValueError, TypeError):
        return math.inf
