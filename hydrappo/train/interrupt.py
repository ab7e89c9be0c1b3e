"""SIGINT (Ctrl-C) and SIGTERM (a cluster preempting the job) while training.

The first signal lets the current step finish; the harness then writes its checkpoint
(atomically, like every checkpoint) and stops with `TrainingInterrupted`, whose message
names that checkpoint. A second signal stops at once: the step in progress is abandoned
(nothing of it is written; a checkpoint being written stays a hidden temporary folder that
the next run removes) and the message names the last complete checkpoint. The exit code is
128 + the signal's number, as a shell reports a process killed by it: 130 for SIGINT, 143
for SIGTERM.

Under torchrun / accelerate launch each process receives the signal at its own moment; at
the end of every step they agree (the largest signal any of them received, one all-reduce),
so all of them save that step (process 0 writes it) and stop together. A second signal stops
the process that receives it at once; the others then stop through the process group (their
collective fails, or the launcher ends them).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from ..errors import HydrappoError, spell

logger = logging.getLogger("hydrappo")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(HydrappoError):
    """Training stopped on SIGINT or SIGTERM; exit code 128 + the signal number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopNow(BaseException):
    """Raised by the second signal wherever the code is; a BaseException, like KeyboardInterrupt,
    so that no `except Exception` on the way turns it into another error. The harness turns it
    into TrainingInterrupted (StopOnSignal.abandoned)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopOnSignal:
    """Between install() and uninstall(), SIGINT/SIGTERM ask the training loop to stop after the
    current step (`requested` holds the signal), and a second one stops at once (StopNow).
    `last_checkpoint()` names the newest checkpoint for the message. Outside the main thread
    nothing is installed."""

    def __init__(self, last_checkpoint: Callable[[], object], describe_step: Callable[[], str]):
        self.last_checkpoint = last_checkpoint
        self.describe_step = describe_step
        self.requested: int | None = None
        self.previous: dict = {}

    def install(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}
        return self

    def uninstall(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def abandoned(self, error: StopNow) -> TrainingInterrupted:
        """The error to raise for a second signal (StopNow) that stopped the step in progress."""
        last = self.last_checkpoint()
        return TrainingInterrupted(
            f"stopped by a second {signal_name(error.signum)} during {self.describe_step()}; that step was abandoned "
            f"and nothing of it was written. The last checkpoint is {last or 'none (no checkpoint was written yet)'}"
            f"{': continue with ' + spell('resume') if last else ''}.",
            error.signum,
        )

    def _handle(self, signum, frame) -> None:
        if self.requested is None:
            self.requested = signum
            logger.warning(
                "%s received: finishing %s, then writing a checkpoint and stopping (send it again to stop at once, "
                "without saving that step)",
                signal_name(signum),
                self.describe_step(),
            )
            return
        raise StopNow(signum)

    def stopped(self, step: int, checkpoint, signum: int | None = None) -> TrainingInterrupted:
        """The error to raise once step `step` finished and `checkpoint` holds it; `signum`: the
        signal the processes agreed on (default: the one this process received)."""
        signum = signum or self.requested
        return TrainingInterrupted(
            f"stopped by {signal_name(signum)} after step {step}; checkpoint {checkpoint} holds it: "
            f"continue with {spell('resume')}.",
            signum,
        )
