"""The command's own output streams, made to survive their reader going away.

`hydrappo train ... 2>&1 | tee log` and Ctrl-C: the shell sends SIGINT to tee too, which dies,
and every later write to the pipe fails (BrokenPipeError); so does a closed terminal. Training
must not fail over its messages: the step in progress would be lost (its metrics line written,
its checkpoint not) and the Ctrl-C handling (train/interrupt.py) never reached. So the command
line writes through `SurvivingStream`: the first failed write sends that stream to the null
device for the rest of the run, and everything else (checkpoints, metrics.jsonl, TensorBoard)
carries on as if nothing happened. The files the run writes hold what the lost output said."""

from __future__ import annotations

import os
import sys


class SurvivingStream:
    """A text stream whose failing writes and flushes are dropped (once one fails, all are)."""

    def __init__(self, stream):
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):  # a broken pipe, a closed terminal or file
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._lose()

    def _lose(self) -> None:
        """From now on the stream's descriptor writes to the null device: what its buffer still
        holds (flushed at exit) goes there too, instead of failing again."""
        self.lost = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name):  # encoding, isatty, fileno, ...: the stream's own
        return getattr(self._stream, name)


def survive_lost_output() -> None:
    """Wrap sys.stdout and sys.stderr (once); call before logging or a progress bar takes them."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, SurvivingStream):
            setattr(sys, name, SurvivingStream(stream))


# Under torchrun / accelerate launch every process runs the command (train/distributed.py);
# process 0 reports, and each process that fails prints its own error.


def launcher_process() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) a launcher set; (0, 1) without one."""
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def report(text: str) -> None:
    """Print `text` once per run: from process 0 of a launcher's processes (every process without one)."""
    if launcher_process()[0] == 0:
        print(text)
