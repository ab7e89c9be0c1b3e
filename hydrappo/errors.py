"""The one base class of every error hydrappo raises on purpose.

An error of this kind carries a message that says what was wrong and how to fix it; the
command line prints just that message (no traceback) and exits with `exit_code`: 2 for
a usage error (an option, a path, a file a user gave), 1 for a failure while running.
Anything else that escapes is a bug, and its traceback is what a report needs.

A message names an option as the user gives it: `--resume` on the command line,
`trainer.train(resume=True)` in Python (`spell`, at the end of this file).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def shortened(value, limit: int = 80) -> str:
    """A value as a message shows it: its repr, at most `limit` characters (a string is cut before
    its repr, so that the quotes stay)."""
    if isinstance(value, str):
        return repr(value if len(value) <= limit else value[: limit - 3] + "...")
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class HydrappoError(Exception):
    """Raised on purpose, with a message for the user."""

    exit_code = 1


class UsageError(HydrappoError, ValueError):
    """Something the user gave (an option, a path, a file) cannot be used as it is."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One broken rule of the options, `option=value rule; fix.`, written once beside what the
    rule protects: config/checks.py reports every one found at once, and the library's own guard
    (the Python API path, e.g. a HydraModel built by hand) raises the same words."""

    option: str
    value: object
    rule: str
    fix: str

    def __str__(self) -> str:
        return f"{self.option}={self.value!r} {self.rule}; {self.fix}."


class DataError(UsageError):
    """Data is unusable; the message says what is wrong and how to fix it."""


class RewardError(HydrappoError, ValueError):
    """A reward source is misconfigured (exit code 2) or failed (RewardFunctionError, 1); the
    message says what to fix."""

    exit_code = 2


class RewardFunctionError(RewardError):
    """A reward source raised, hung past reward.timeout_s, or returned something that is not one
    finite number per sample. The message names the source, the step and one offending sample."""

    exit_code = 1


class WriteError(HydrappoError):
    """The operating system refused a write (a full disk, a permission, a read-only file system):
    the message says what could not be written, where, why in plain words, and what survives."""


_PLAIN = {  # errno -> (what the operating system said, what to do)
    errno.ENOSPC: ("no space left on device", "free space"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space or raise the quota"),
    errno.EACCES: ("permission denied", "make the folder writable for this user, or choose another"),
    errno.EPERM: ("operation not permitted", "make the folder writable for this user, or choose another"),
    errno.EROFS: ("the file system is read-only", "choose a folder on a writable file system"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "move that file away, or choose another folder"),
    errno.EIO: ("an input/output error (the disk or the network file system failed)", "check the disk"),
}
_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)|\berrno[ =:]*(\d+)", re.IGNORECASE)
_LITTLE_SPACE = 64 << 20  # bytes: a torch.save that fails with this little room left ran out of it


def _errno_of(error: BaseException) -> int | None:
    """The errno of an OSError, or of one that another library wrapped (safetensors' SafetensorError
    says "... (os error 28)"), following the chain of causes."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OSError) and error.errno:
            return error.errno
        match = _OS_ERROR_IN_TEXT.search(str(error))
        if match and type(error).__name__ == "SafetensorError":
            return int(match.group(1) or match.group(2))
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def describe_os_error(error: BaseException, where: str | os.PathLike | None = None) -> tuple[str, str] | None:
    """(what went wrong in plain words, what to do) for a write the operating system refused, or
    None when `error` is not one. torch.save's writer reports a full disk without its errno
    ("unexpected pos", "file write failed"): with little space left at `where` it is one."""
    code = _errno_of(error)
    if code is None and type(error).__name__ in ("RuntimeError", "SafetensorError"):
        text = str(error)
        if "inline_container" in text or "PytorchStreamWriter" in text or "os error" in text:
            if where is not None and _free_bytes(Path(where)) < _LITTLE_SPACE:
                code = errno.ENOSPC
            else:
                return f"the file system refused the write ({text.splitlines()[0][:160]})", "check the disk"
    if code is None:
        return None
    return _PLAIN.get(code, (os.strerror(code).lower(), "check the folder"))


def _free_bytes(path: Path) -> int:
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return 1 << 62


@contextmanager
def plain_write_errors(what: str, where: str | os.PathLike, survives: str, then: str = ""):
    """Turn a write the operating system refuses inside the block into one WriteError:
    "WHAT could not be written to WHERE: REASON; SURVIVES; FIX[ THEN]." (e.g. then="and continue
    with --resume"). Every other error passes through unchanged."""
    try:
        yield
    except HydrappoError:
        raise
    except Exception as error:
        described = describe_os_error(error, where)
        if described is None:
            raise
        reason, fix = described
        then = f" {then}" if then else ""
        raise WriteError(f"{what} could not be written to {where}: {reason}; {survives}; {fix}{then}.") from None


def refused_pickle(error: BaseException, folder: str | os.PathLike, option: str) -> str | None:
    """The message for a model folder whose pickled weights (pytorch_model*.bin) torch's
    weights_only loader refused, naming the file and what it holds; None for any other error."""
    if type(error).__name__ != "UnpicklingError" or "weights_only" not in str(error).replace(
        "Weights only", "weights_only"
    ):
        return None
    folder = Path(folder)
    files = sorted(path.name for path in folder.glob("*.bin")) or ["its pickled weights file"]
    named = files[0] if len(files) == 1 else f"one of {', '.join(files[:4])}{' ...' if len(files) > 4 else ''}"
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    holds = f"{found.group(1)}, which" if found else "an object that"
    return (
        f"{option}={str(folder)!r}: {named} is a pickle that holds {holds} torch's safe loader (weights_only) refuses: "
        "loading it could run code, and hydrappo loads weights only as data (it has no option to trust a pickle). "
        "Use the model's .safetensors weights instead: download them from its source, or convert a copy you trust "
        "(`AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW, safe_serialization=True)` on a machine "
        "where running its code is acceptable)."
    )


# ---------------------------------------------------------------------------- how the user spells an option
# The same run is started two ways: `hydrappo train CONFIG --resume --overwrite_output_dir`, or
# `PPOTrainer(..., args={...}).train(resume=True)`. A message tells the user what to give in the way
# they started it: code that names an option or an argument in a message writes `spell(name)`, and
# the command line (cli.main) runs under `on_the_command_line()`. Outside it, Python's spelling.
_COMMAND_LINE = False
TRAIN_ARGUMENTS = ("resume",)  # arguments of a trainer's train(); any other name is a config option


def spell(name: str, value=True) -> str:
    """How the user sets `name` = `value` where they started hydrappo. `name`: an argument of a
    trainer's train() ('resume') or a config option 'section.option'. `value` True: the flag alone.

        spell("resume")                          --resume | trainer.train(resume=True)
        spell("resume", path)                    --resume PATH | trainer.train(resume='PATH')
        spell("train.overwrite_output_dir")      --overwrite_output_dir | args={"train": {"overwrite_output_dir": True}}
    """
    section, _, option = name.rpartition(".")
    if _COMMAND_LINE:
        return f"--{option}" if value is True else f"--{option} {value}"
    if name in TRAIN_ARGUMENTS:
        return f"trainer.train({name}={value if value is True else str(value)!r})"
    return f'args={{"{section}": {{"{option}": {value!r}}}}}'


@contextmanager
def on_the_command_line():
    """Messages spell options as the command line takes them, for the duration of the block."""
    global _COMMAND_LINE
    before, _COMMAND_LINE = _COMMAND_LINE, True
    try:
        yield
    finally:
        _COMMAND_LINE = before
