"""Writes that never leave a half-written result where a complete one is expected.

Every folder hydrappo writes (checkpoints, exported models, converted GGUF models) is
filled in a hidden temporary sibling, `.NAME.tmp-PID@HOST-XXXX`, and renamed into place
when complete; a rename within one file system is atomic. A folder it replaces is renamed
aside first and deleted only after the new one is in place. Temporary folders (and files, of
write_text) of dead processes (a killed run) are removed by the next writer on the same host:
the host name in the name keeps a writer from deleting what another machine of a shared file
system is writing (its PIDs mean nothing here), and a symbolic link is never followed or removed.

The one exception is a model directory that also holds other files (the SFT stage
writes its model into its output_dir next to its logs and checkpoints): its files are
replaced one by one with config.json last, and config.json is removed first, so an
interrupted write never looks like a complete model (transformers needs config.json).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import UsageError, spell

# `.NAME.tmp-PID@HOST-XXXX` (and `.old-`); a host name holds letters, digits, dots and dashes.
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(tmp|old)-(?P<pid>\d+)@(?P<host>[A-Za-z0-9._-]+)-[^-]+$")


def host_name() -> str:
    """This machine's name as it appears in temporary names (anything unusual replaced by _)."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"


def temporary_prefix(name: str, kind: str = "tmp") -> str:
    """`.NAME.tmp-PID@HOST-`: what this process's temporary siblings of NAME start with."""
    return f".{name}.{kind}-{os.getpid()}@{host_name()}-"


def is_nonempty_dir(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _process_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_orphaned_temporaries(parent: Path) -> list[Path]:
    """Delete `.NAME.tmp-PID@HOST-*` / `.NAME.old-PID@HOST-*` folders and files (write_text's) in
    `parent` that a process of this host wrote and that is gone. Another host's (a shared file
    system), one in the format of an older version (no host: whose it is cannot be told) and
    symbolic links stay."""
    removed = []
    if not parent.is_dir():
        return removed
    here = host_name()
    for child in parent.iterdir():
        match = _TEMPORARY.match(child.name)
        if not match or match["host"] != here or child.is_symlink() or not (child.is_dir() or child.is_file()):
            continue
        pid = int(match["pid"])
        if pid != os.getpid() and not _process_is_alive(pid):
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
            removed.append(child)
    return removed


def refuse_symlink(target: Path) -> None:
    """A path hydrappo is about to replace must be its own folder (or absent), never a symbolic
    link or a file someone put there: neither is followed, replaced nor deleted."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        what = f"a symbolic link (to {os.readlink(target)})" if target.is_symlink() else "a file"
        raise UsageError(
            f"{target} is {what}, not a folder hydrappo wrote: it is neither followed nor replaced. Move it out of "
            f"{target.parent} and run again (a training run continues with {spell('resume')})."
        )


def _normal_modes(root: Path) -> None:
    """mkdtemp makes a private folder, and some writers private files; what we publish is an
    ordinary readable folder whose files all have the same mode."""
    umask = os.umask(0)
    os.umask(umask)
    for path in (root, *root.rglob("*")):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def write_directory(target: str | os.PathLike, fill: Callable[[Path], None], *, replace: bool = False) -> Path:
    """Call `fill(tmp)` on a fresh temporary sibling of `target`, then rename it to `target`.

    An existing non-empty `target` is replaced only with `replace=True` (renamed aside, then
    deleted once the new one is in place); otherwise FileExistsError. An empty one is
    replaced. Returns `target`."""
    target = Path(target).expanduser().absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_orphaned_temporaries(target.parent)
    refuse_symlink(target)
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(target.name), dir=target.parent))
    try:
        fill(tmp)
        _normal_modes(tmp)
        if is_nonempty_dir(target):
            if not replace:
                raise FileExistsError(target)
            old = Path(tempfile.mkdtemp(prefix=temporary_prefix(target.name, "old"), dir=target.parent))
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if target.is_dir():
                target.rmdir()
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_files_into(
    directory: str | os.PathLike,
    fill: Callable[[Path], None],
    last: str = "config.json",
    stale: Callable[[Path], bool] = lambda path: False,
) -> Path:
    """Write the files `fill(tmp)` makes into an existing `directory` that holds other things
    too: `last` is removed first and moved in last; files for which `stale(path)` is true and
    that the new set does not replace are removed (e.g. weights of an older model)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    remove_orphaned_temporaries(out)
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(out.name), dir=out))
    try:
        fill(tmp)
        _normal_modes(tmp)
        (out / last).unlink(missing_ok=True)
        new = {f.name for f in tmp.iterdir()}
        for old in out.iterdir():
            if old.is_file() and old.name not in new and stale(old):
                old.unlink()
        for file in sorted(tmp.iterdir(), key=lambda f: f.name == last):
            os.replace(file, out / file.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Replace a small text file atomically (write a sibling, then rename over it)."""
    path = Path(path)
    tmp = path.with_name(f"{temporary_prefix(path.name)}file")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def rename_to_sibling(path: Path, tag: str) -> Path:
    """Rename `path` to a new sibling `NAME.<tag>-<time>` (with `-<n>` if that exists), never
    overwriting anything, and return the new path: how an earlier run or a damaged checkpoint
    is kept for a look instead of deleted."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.{tag}-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.{tag}-{stamp}-{n}")
        n += 1
    os.replace(path, target)
    return target
