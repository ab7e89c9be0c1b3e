"""An output folder belongs to one run: a new run never writes over an earlier one.

A training command that starts (not `--resume`) in an output_dir that already holds a run
(checkpoint-<step> folders, a model written by sft) is refused, unless `--overwrite_output_dir`
is given: then the earlier run is moved, whole, to the sibling folder `OUTPUT_DIR.previous`.
A folder that holds only the logs of a run that failed before its first checkpoint
(tensorboard/, metrics.jsonl, the tokenizer/ a run given its tokenizer in Python saved, a stale lock) blocks nothing: the fixed command starts afresh and
those logs move to `OUTPUT_DIR.previous` the same way. One such sibling at most: one that holds
only logs is replaced (the message says so), one that holds checkpoints or a model is never
deleted (the new run is refused until it is renamed or removed). `hydrappo export --out`
moves an existing folder to `NAME.previous-<time>`.

While a run trains, its process (process 0 under a launcher) holds an OS lock (flock) on
`OUTPUT_DIR/.hydrappo.lock`, which names the holder (host, PID, start time): a second run
started into the same folder, even at the same moment, is refused before it writes anything.
The OS drops the lock when the process ends, however it ends, so the file a crashed run
leaves behind never blocks `--resume`. Nothing is moved aside (`--overwrite_output_dir`, `export
--out ... --overwrite`) that is, contains or lies inside the folder of a run that another live
process holds. (On file systems without flock support, e.g. some network mounts, locking is
skipped with a warning.)
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import time
from pathlib import Path

from ..config import besides_run_tokenizer, input_paths, startup_inputs, writable_folder_problem
from ..errors import UsageError, spell
from .atomic import rename_to_sibling
from .checkpoint import CheckpointError, checkpoint_dirs, resolve_resume, resume_check

logger = logging.getLogger("hydrappo")

_RUN_FILES = re.compile(
    r"^(checkpoint-\d+|metrics(\..+)?\.jsonl|tensorboard|tokenizer|config\.json|adapter_config\.json|sft_config\.yaml)$"
)
# What a run writes before any weights: its logs, and the tokenizer it was given in Python (run_tokenizer.py).
_LOG_FILES = re.compile(r"^(metrics(\..+)?\.jsonl|tensorboard|tokenizer)$")


class OutputDirError(UsageError):
    """An output folder cannot be used as asked; the message says what to do instead."""


LOCK_NAME = ".hydrappo.lock"
_HELD: dict[Path, int] = {}  # output folder -> descriptor of its locked file, in this process
_NAMED: set[int] = set()  # the descriptors whose file names this process as the holder


def lock_output_dir(output_dir: str | os.PathLike, option: str = "train.output_dir") -> list[Path]:
    """Hold the run lock of `output_dir` (created if missing) until release_output_dir or the
    end of this process; OutputDirError naming the holder if another process holds it.
    Returns what it created (the folder, the lock file), for a refused claim to remove."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return []
    root = Path(output_dir).expanduser().absolute()
    created = [] if root.exists() else [root]
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_NAME
    held = _HELD.get(root)
    if held is not None:
        try:
            if os.fstat(held).st_ino == path.stat().st_ino:
                return []  # this process holds it already (a second claim of the same run)
        except OSError:
            pass
        release_output_dir(root)  # the folder was moved aside (and its lock with it): lock the new one
    if not path.exists():
        created.append(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "a process that has not written its name yet"
        os.close(fd)
        raise OutputDirError(
            f"{option}={str(output_dir)!r} is in use by another run ({holder}); two runs in one folder would interleave "
            "their metrics and replace each other's checkpoints. Wait for it to end (or stop it), or choose another "
            "output_dir."
        ) from None
    except OSError as error:  # a file system without locks
        logger.warning("%s: cannot lock %s (%s); make sure no other run writes into this folder.", option, path, error)
        os.close(fd)
        return created
    _HELD[root] = fd
    return created


def name_lock_holder(output_dir: str | os.PathLike) -> None:
    """Write who holds the run lock of `output_dir` into its file (host, PID, start time),
    once the folder is this run's: a refused run leaves an earlier run's lock file as it was."""
    fd = _HELD.get(Path(output_dir).expanduser().absolute())
    if fd is not None and fd not in _NAMED:  # a second claim of the same run keeps the first start time
        line = f"host {socket.gethostname()}, PID {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, line.encode(), 0)  # at the start: the descriptor's own offset may lie past the end
        _NAMED.add(fd)


def release_output_dir(output_dir: str | os.PathLike) -> None:
    """Let go of the run lock of `output_dir` if this process holds it (the file stays)."""
    fd = _HELD.pop(Path(output_dir).expanduser().absolute(), None)
    if fd is not None:
        _NAMED.discard(fd)
        os.close(fd)


def live_run_holder(folder: Path) -> str | None:
    """Who holds the run lock of `folder` (the line its lock file names) when another live
    process holds it; None when nobody does (no lock file, or a stale one of a dead run)."""
    path = folder / LOCK_NAME
    if folder.absolute() in _HELD or path.is_symlink() or not path.is_file():
        return None  # this process's own run is the caller's business
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # let go of at once: this only asks
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        return os.read(fd, 4096).decode("utf-8", "replace").strip() or "a process that has not written its name yet"
    except OSError:  # a file system without locks: nobody can be told to hold it
        return None
    finally:
        os.close(fd)


def refuse_moving_live_runs(path: Path, option: str) -> None:
    """OutputDirError if moving `path` aside would take a live run's files from under it: `path`
    is, lies inside or contains the folder of a run that another process is training."""
    folders = [path, *path.parents]
    if path.is_dir() and not path.is_symlink():
        folders += [Path(top) for top, _, files in os.walk(path) if LOCK_NAME in files and Path(top) != path]
    for folder in folders:
        holder = live_run_holder(folder)
        if holder is None:
            continue
        how = "is" if folder == path else ("lies inside" if folder in path.parents else "contains")
        raise OutputDirError(
            f"{option} {path}: {how} the folder of a run that is training ({folder}, held by {holder}); moving it "
            f"aside would pull files from under that run. Wait for the run to end (or stop it), or choose "
            f"another {option}."
        )


def refuse_own_inputs(
    out: str | os.PathLike | None, inputs: dict, option: str, file: bool = False, contains: bool = True
) -> None:
    """OutputDirError if the path a command writes (`out`, given as `option`) is, contains or
    lies inside one of its `inputs` ({option name: path}; names that are no local path, such as
    a Hub id, are skipped): checked before anything is moved aside or written. A new `file`
    written in place (a report) may lie inside an input folder, never over a file there.
    `contains=False`: an output folder may hold these inputs (files read once as a run starts,
    which stay where they are unless the folder is moved aside)."""
    if out is None:
        return
    target = Path(out).expanduser().resolve()
    for name, value in inputs.items():
        if not value or not Path(str(value)).expanduser().exists():
            continue
        source = Path(str(value)).expanduser().resolve()
        if source == target:
            how = "is"
        elif target in source.parents and contains:
            how = "contains"
        elif source in target.parents and (not file or target.exists()):
            how = "lies inside"
        else:
            continue
        raise OutputDirError(
            f"{option}={str(out)!r} {how} {name} ({source}), which this command reads: writing there would move "
            "aside or overwrite its own input. Choose an output outside it."
        )


_CHECKPOINT = re.compile(r"^checkpoint-\d+$")


def with_run_folders(inputs: dict) -> dict:
    """`inputs` and, for each that is a checkpoint-<step> folder, the run folder that holds it
    (its metrics, logs and other checkpoints are that run's too)."""
    more = dict(inputs)
    for name, value in inputs.items():
        if value and _CHECKPOINT.match(Path(str(value)).name):
            more[f"the run of {name}"] = str(Path(str(value)).parent)
    return more


def earlier_run(output_dir: str | os.PathLike) -> list[str]:
    """The names in `output_dir` that belong to an earlier run (empty: none)."""
    root = Path(output_dir).expanduser()
    if not root.is_dir():
        return []
    return sorted(child.name for child in root.iterdir() if _RUN_FILES.match(child.name))


def move_aside(path: str | os.PathLike, tag: str = "previous") -> Path:
    """Rename a folder (or file) to a new sibling `NAME.previous-<time>` and return that."""
    path = Path(path).expanduser().absolute()
    refuse_unmovable(path)
    return rename_to_sibling(path, tag)


def refuse_unmovable(path: Path) -> None:
    """OutputDirError for the current directory, one of its parents, the home folder or a root."""
    here = Path.cwd().absolute()
    if path == here or path in here.parents or path == Path.home() or path == Path(path.anchor):
        raise OutputDirError(
            f"{path} is the current directory, one of its parents or the home folder: it cannot be moved aside. "
            "Choose a folder of its own for the output."
        )


def resumes_in(resume, output_dir: str | os.PathLike) -> bool:
    """Whether `resume` (True/'latest', or a checkpoint path) continues the run in `output_dir`."""
    if resume in (True, "latest", ""):
        return True
    return Path(resume).expanduser().resolve().parent == Path(output_dir).expanduser().resolve()


def claim_output_dir(
    output_dir: str | os.PathLike,
    *,
    resume=None,
    overwrite: bool = False,
    option: str = "train.output_dir",
    move: bool = True,
    inputs: dict | None = None,
    read_once: dict | None = None,
    records_tokenizer: bool = False,
) -> Path | None:
    """Check, before a run writes anything, that `output_dir` is its own. Returns the folder
    the earlier run was moved to (with `overwrite`), else None. Resuming the run in
    `output_dir` is what it is for; resuming from a checkpoint elsewhere is a new run here.
    `move=False` (every process of a launcher run but process 0, which writes): the same
    checks, but an earlier run is left for process 0 to move. `inputs` ({option: path}, what
    the run keeps reading): output_dir must not be, contain or lie inside one. `read_once`
    (the config file, reward code; the checkpoint resumed from elsewhere is added here):
    output_dir must not be or lie inside one, nor be moved aside while it holds one. The run's own
    tokenizer folder (config.run_tokenizer_path: the tokenizer a run was given in Python, saved there,
    storage/run_tokenizer.py) is no input to keep out when the run continues in output_dir or
    `records_tokenizer` (this run saves it there itself)."""
    problem = writable_folder_problem(output_dir)
    if problem:
        raise OutputDirError(
            f"{option}={str(output_dir)!r}: cannot hold the run's files: {problem}. Choose another folder."
        )
    inputs, read_once = dict(inputs or {}), dict(read_once or {})
    if records_tokenizer or (resume and resumes_in(resume, output_dir)):
        inputs = besides_run_tokenizer(inputs, output_dir)
    if resume and not resumes_in(resume, output_dir):
        read_once["the checkpoint to resume from"] = str(resume)
    refuse_own_inputs(output_dir, inputs, option)
    refuse_own_inputs(output_dir, read_once, option, contains=False)
    created = lock_output_dir(output_dir, option) if move else []  # no other run may claim the folder from here on
    try:
        moved = _claim_locked(output_dir, resume, overwrite, option, move, {**inputs, **read_once})
    except BaseException:  # refused: leave the folder as it was
        for path in reversed(created):
            path.unlink() if path.is_file() else path.rmdir()
        release_output_dir(output_dir)
        raise
    if move:
        name_lock_holder(output_dir)
    return moved


def _claim_locked(output_dir, resume, overwrite: bool, option: str, move: bool, inputs: dict) -> Path | None:
    found = earlier_run(output_dir)
    shown = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
    if resume and resumes_in(resume, output_dir):
        if overwrite:
            raise OutputDirError(
                f"{spell('resume')} continues the run in {option}={str(output_dir)!r} and "
                f"{spell('train.overwrite_output_dir')} would move it aside: give one of them."
            )
        if resume in (True, "latest", "") and not checkpoint_dirs(output_dir):  # (the same test as resolve_resume's)
            raise CheckpointError(
                f"{spell('resume')}: no checkpoint found in {option}={str(output_dir)!r}, so there is nothing to "
                "continue; "
                + (
                    f"it holds the files of a run that ended before its first checkpoint ({shown}): start without "
                    f"{spell('resume')} (they are moved to {previous_folder(output_dir)}, not deleted), or choose another "
                    "output_dir."
                    if found
                    else f"start without {spell('resume')}."
                )
            )
        return None
    if not found:
        return None
    failed = not holds_weights(output_dir)  # the logs of a run that failed before its first checkpoint
    if not overwrite and not failed:
        overwrite = spell("train.overwrite_output_dir")
        how = (
            f"Continue it with {spell('resume')}, start a new run over it with {overwrite}"
            if checkpoint_dirs(output_dir)
            else f"Start a new run over it with {overwrite}"
        )
        raise OutputDirError(
            f"{option}={str(output_dir)!r} already holds a run ({shown}). {how} (the earlier run is moved to "
            f"{previous_folder(output_dir)}, not deleted), or choose another output_dir."
        )
    refuse_own_inputs(output_dir, inputs, option)  # moved aside, it would take them along
    if not move:
        return None
    root = Path(output_dir).expanduser().absolute()
    refuse_moving_live_runs(root, option)  # (its own lock is this process's)
    moved, replaced = move_to_previous(root, option)
    lock_output_dir(output_dir, option)  # the lock file went with the earlier run: lock the new folder
    what = "the logs of a run that wrote no checkpoint" if failed else "the earlier run"
    logger.warning(
        "%s: %s in %s (%s) moved to %s%s",
        option,
        what,
        output_dir,
        shown,
        moved,
        " (replacing the logs of a failed run kept there before)" if replaced else "",
    )
    return moved


def holds_weights(folder: str | os.PathLike) -> bool:
    """Whether a run folder holds a checkpoint or a model (anything of a run besides its logs)."""
    return bool(checkpoint_dirs(folder)) or any(not _LOG_FILES.match(name) for name in earlier_run(folder))


def previous_folder(output_dir: str | os.PathLike) -> Path:
    """Where an earlier run in `output_dir` is moved: the one sibling OUTPUT_DIR.previous."""
    root = Path(output_dir).expanduser().absolute()
    return root.with_name(root.name + ".previous")


def move_to_previous(root: Path, option: str) -> tuple[Path, bool]:
    """Move the run folder `root` to `previous_folder(root)`; returns it and whether an earlier
    sibling there (the logs of a failed run, nothing more) was replaced. A sibling that holds a
    checkpoint or a model, or anything that is no run folder, is never deleted: OutputDirError."""
    refuse_unmovable(root)
    target = previous_folder(root)
    replaced = False
    if target.exists() or target.is_symlink():
        keeps = (
            target.is_symlink()
            or not target.is_dir()
            or holds_weights(target)
            or any(not (_LOG_FILES.match(child.name) or child.name == LOCK_NAME) for child in target.iterdir())
        )
        if keeps:
            raise OutputDirError(
                f"{option}={str(root)!r}: the earlier run would move to {target}, which already holds another one "
                f"({', '.join(sorted(p.name for p in target.iterdir() if p.name != LOCK_NAME)[:6]) if target.is_dir() else 'a file'}). "
                "Rename or remove that folder to keep or drop it (hydrappo deletes no checkpoint), then run again."
            )
        refuse_moving_live_runs(target, option)
        shutil.rmtree(target)
        replaced = True
    os.replace(root, target)
    return target, replaced


def start_run(config, resume_arg, *, writer: bool = True):
    """What a training command does before any model loads: claim `config`'s train.output_dir for
    this run (checked against what the run reads: config.input_paths, config.startup_inputs) and
    find the checkpoint `--resume` names (damaged newer ones set aside), refusing an option that
    may not change on resume. Returns the checkpoint to resume from, or None. Under a launcher
    every process checks the same, and only process 0 (`writer`) renames anything."""
    output_dir = config.train.output_dir
    claim_output_dir(
        output_dir,
        resume=resume_arg,
        overwrite=config.train.overwrite_output_dir,
        move=writer,
        inputs=input_paths(config),
        read_once=startup_inputs(config),
    )
    if not resume_arg:
        return None
    checkpoint = resolve_resume(resume_arg, output_dir, set_aside=writer)
    resume_check(checkpoint, config)
    return checkpoint


def claim_output_path(
    path: str | os.PathLike | None, *, overwrite: bool, option: str, folder: bool = True, inputs: dict | None = None
) -> Path | None:
    """The same rule for a path a conversion writes (`export --out`, `--value-head FILE`): a
    non-empty folder or an existing file is refused without `overwrite`, moved aside with it;
    one that is, contains or lies inside one of its `inputs` is refused either way."""
    if path is None:
        return None
    refuse_own_inputs(path, inputs or {}, option)
    path = Path(path).expanduser().absolute()
    if folder and path.exists() and not path.is_dir():
        raise OutputDirError(f"{option} {path}: is a file, not a folder; choose a folder.")
    if not folder and path.is_dir():
        raise OutputDirError(f"{option} {path}: is a folder; name a file.")
    problem = writable_folder_problem(path if folder else path.parent)
    if problem:
        raise OutputDirError(f"{option} {path}: cannot be written: {problem}.")
    in_use = (path.is_dir() and any(path.iterdir())) if folder else path.exists()
    if in_use:
        if not overwrite:
            raise OutputDirError(
                f"{option} {path}: already exists{' and is not empty' if folder else ''}. Choose another, or pass "
                "--overwrite_output_dir to move the existing one to a sibling (NAME.previous-<time>); nothing is deleted."
            )
        refuse_moving_live_runs(path, option)
        moved = move_aside(path)
        logger.warning("%s: the existing %s was moved to %s", option, path, moved)
    return path
