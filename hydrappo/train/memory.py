"""Out of memory, the way one-GPU runs die: named where it happens, and, when asked, backed off.

Each phase of a step that can run out of memory runs inside `memory_phase(name, **sizes)`: CUDA's
out-of-memory error (torch.OutOfMemoryError) or the host's (MemoryError) becomes an `OutOfMemory`
naming the phase, the sizes in play and the options that shrink them. The command line prints it
without a traceback and exits with status 3 (OutOfMemory.exit_code): a script that restarts runs can
tell "out of memory" from a bug (1) or a usage error (2). The step in flight is not logged, and the
checkpoints already written stay as they are (a checkpoint is written to a temporary folder and
renamed into place: one that runs out of memory while being written never appears).

With `train.oom_backoff: N` a run may instead shrink the chunk of the phase that ran out, up to N
times over the run, and go on (`BackOff`):

- sampling, the experience pass and scoring: generation.generation_batch_size is halved and the
  step starts again from its beginning, with the random state, the prompt sampler and the running
  statistics it started with, so it samples what a run with the smaller chunks would have;
- the update: ppo.gradient_accumulation_steps is doubled (micro-batches of half the rows) and the
  minibatch in flight starts again, its partial gradients dropped; the minibatches already stepped
  stand (an optimizer step is the same however its minibatch was chunked, up to rounding);
- held-out evaluation: its batch is halved and the evaluation runs again (it restores the random
  state it found, so it is not changed by the retry).

Each back-off is logged (a warning, and `oom/backoffs_total` in the step's metrics) with the new
size, and is kept by the rest of the run.
"""

from __future__ import annotations

import gc
import logging
from contextlib import contextmanager

import torch

from ..errors import HydrappoError

logger = logging.getLogger("hydrappo")

MEMORY_ERRORS = (torch.OutOfMemoryError, MemoryError)

# phase -> what shrinks it (the options a message names)
REMEDIES = {
    "sampling": "lower generation.generation_batch_size (responses generated at once) or generation.max_new_tokens",
    "the experience pass": "lower generation.generation_batch_size (sequences per pass of the hydra)",
    "scoring": "lower generation.generation_batch_size, or the reward model's batch",
    "the update": "raise ppo.gradient_accumulation_steps (smaller micro-batches), lower ppo.mini_batch_size, or set "
    "model.gradient_checkpointing: true",
    "held-out evaluation": "lower generation.generation_batch_size (held-out answers generated at once)",
    "writing a checkpoint": "free host memory (a checkpoint is copied to the CPU as it is written)",
}
BACKOFF_HINT = "; or let the run shrink the chunk and go on: train.oom_backoff: 3 (--oom_backoff 3)"


class OutOfMemory(HydrappoError):
    """The run ran out of memory in `phase`, with `sizes` in play."""

    exit_code = 3

    def __init__(self, phase: str, sizes: dict, detail: str, step: int | None = None):
        self.phase, self.sizes, self.detail, self.step = phase, sizes, detail, step
        super().__init__(self.message())

    def message(self) -> str:
        where = f"step {self.step}, " if self.step is not None else ""
        sizes = ", ".join(f"{name} {value}" for name, value in self.sizes.items())
        remedy = REMEDIES.get(self.phase, "lower the batch and chunk sizes")
        backoff = BACKOFF_HINT if self.phase in BackOff.SHRINKS else ""
        return (
            f"out of memory in {self.phase} ({where}{sizes}){device_peak()}: {self.detail}. To fit: {remedy}{backoff}. "
            "The checkpoints already written are intact: --resume continues from the last one."
        )

    def at_step(self, step: int) -> OutOfMemory:
        self.step = step
        self.args = (self.message(),)
        return self


def device_peak() -> str:
    """'; peak 21.3 GiB of 24.0 GiB on cuda:0' when a GPU is in use, else ''."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return ""
    device = torch.cuda.current_device()
    peak, total = torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
    return f"; peak {peak / 2**30:.1f} GiB of {total / 2**30:.1f} GiB on cuda:{device}"


@contextmanager
def memory_phase(phase: str, **sizes):
    """Run a phase of a step; running out of memory in it is an OutOfMemory naming it and `sizes`."""
    try:
        yield
    except MEMORY_ERRORS as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise OutOfMemory(phase, sizes, f"{type(error).__name__}: {detail}") from None


def free_cached_memory() -> None:
    """What a retry can get back: Python's garbage and the CUDA caching allocator's free blocks."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class BackOff:
    """train.oom_backoff: how many more times this run may shrink a chunk after running out of
    memory, and the shrinking itself. `total` counts the back-offs made (oom/backoffs_total)."""

    SHRINKS = ("sampling", "the experience pass", "scoring", "the update", "held-out evaluation")

    def __init__(self, allowed: int):
        self.left, self.total = allowed, 0

    def shrink(self, error: OutOfMemory, config, processes: int = 1) -> str | None:
        """Shrink the option that sizes `error.phase` in `config`, if one may: the change made (for
        the log), or None (no back-off left, or nothing left to halve: the run ends with `error`)."""
        if self.left <= 0 or error.phase not in self.SHRINKS:
            return None
        if processes > 1 and error.phase != "the update":  # a step restarted by one process alone would
            return None  # leave the others waiting in its collectives; an update's micro-batches are its own
        change = _halve(error.phase, config, processes)
        if change is None:
            return None
        self.left -= 1
        self.total += 1
        free_cached_memory()
        logger.warning(
            "out of memory in %s at step %s: %s; trying again (%d back-off(s) left, train.oom_backoff)",
            error.phase,
            error.step,
            change,
            self.left,
        )
        return change


def _halve(phase: str, config, processes: int) -> str | None:
    if phase == "the update":
        ppo = config.ppo
        doubled = 2 * ppo.gradient_accumulation_steps
        if ppo.mini_batch_size % (processes * doubled):  # a micro-batch of one row (per process) cannot be halved
            return None
        ppo.gradient_accumulation_steps = doubled
        return f"ppo.gradient_accumulation_steps {doubled // 2} -> {doubled}"
    generation = config.generation
    if generation.generation_batch_size <= 1:
        return None
    before = generation.generation_batch_size
    generation.generation_batch_size = before // 2
    return f"generation.generation_batch_size {before} -> {before // 2}"
