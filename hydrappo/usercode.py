"""Calling code a user wrote (a reward function, and the module that defines it): whatever it
does, the trainer stays in charge.

Inside user code, `sys.exit()` (argparse's exits included) and `raise KeyboardInterrupt` are bugs
of that code, not requests to end training quietly: `call` (a call) and `running` (any block,
e.g. importing a reward module) turn them into a UserCodeError naming the code and the step or
the import. A real Ctrl-C that arrives meanwhile stays a Ctrl-C (while training, Ctrl-C and SIGTERM
are handled by train/interrupt.py and never raise KeyboardInterrupt there). Only hydrappo's own
parsers (CommandParser) end a command with argparse's exit code.

A non-daemon thread that user code starts and leaves running would keep the process alive after
training ends (Python waits for such threads at exit, and a thread cannot be stopped from
outside): `call` and `running` note such threads. The command line, once the command has
returned (every checkpoint, metrics line and log written and closed), warns about them and ends
the process with os._exit instead of waiting (cli.main). A library cannot end its caller's
process: through the Python API, `trainer.train()` warns at its end, naming the threads, and the
program ends when they do. Daemon threads are left alone: they never block the exit.

Every `file.py:name` or `package.module:name` a config names (reward functions, tools,
environments, tool-call parsers) is loaded by `load_object`, the one loader. While a run's code
loads (`one_module_per_file`, around train/inputs.read_inputs) a file is imported once and is then
one module, whatever names it, so a reward function and an environment class from the same file
share its module-level state and its classes (`isinstance` holds). Each run imports its files
afresh: two runs in one process do not share a file's module state.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import HydrappoError, UsageError

# Threads started by user code and alive when its call returned: (thread, what started it).
LEFT_BEHIND: list[tuple[threading.Thread, str]] = []


class UserCodeError(HydrappoError):
    """User code called sys.exit() or raised KeyboardInterrupt."""

    exit_code = 1


class ParserExit(SystemExit):
    """The exit of one of hydrappo's own argument parsers (--help, a usage error it printed)."""


class CommandParser(argparse.ArgumentParser):
    """hydrappo's command-line parsers: their exits, and only theirs, end a command with
    argparse's code (a parser that user code builds raises a plain SystemExit)."""

    def exit(self, status=0, message=None):
        try:
            super().exit(status, message)
        except SystemExit as done:
            raise ParserExit(done.code) from None


@contextmanager
def running(what: str, at_import: bool = False):
    """Run the block as user code (`what` names it in messages: "reward function 'f.py:score'
    at step 3"); `at_import`: the block imports the user's module."""
    before = set(threading.enumerate())
    real_interrupts: list[int] = []
    handler = _catch_real_interrupts(real_interrupts)
    try:
        yield
    except SystemExit as error:
        code = "" if error.code is None else repr(error.code)
        last = traceback.extract_tb(error.__traceback__)[-1:]
        hint = (
            (
                " (argparse: it parsed the command line, which holds hydrappo's arguments; parse arguments under "
                "`if __name__ == '__main__':`)"
            )
            if last and Path(last[0].filename).name == "argparse.py"
            else ""
        )
        raise UserCodeError(
            f"{what} called sys.exit({code}) (SystemExit){' while it was imported' if at_import else ''}{hint}; code "
            "the trainer runs must not end the process. "
            + (
                "Raise an error that says what went wrong instead."
                if at_import
                else "Return a value (or raise an error that says what went wrong)."
            )
        ) from None
    except KeyboardInterrupt:
        if real_interrupts:
            raise
        raise UserCodeError(
            f"{what} raised KeyboardInterrupt{' while it was imported' if at_import else ''}; code the trainer runs "
            "must not (Ctrl-C while training stops after the current step with a checkpoint). Raise another "
            "exception that says what went wrong."
        ) from None
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        for thread in threading.enumerate():
            if thread not in before and thread.is_alive() and not thread.daemon:
                LEFT_BEHIND.append((thread, what + (" (at import)" if at_import else "")))


def _catch_real_interrupts(seen: list[int]):
    """While Python's own SIGINT handler is in place (in the main thread), note a real Ctrl-C
    before it raises KeyboardInterrupt, so that `running` tells it from user code's own raise.
    Returns the handler to put back, or None when nothing was changed."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return None

    def interrupted(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, interrupted)


def call(fn: Callable[..., Any], what: str, /, *args, **kwargs) -> Any:
    """fn(*args, **kwargs) as user code (`running`)."""
    with running(what):
        return fn(*args, **kwargs)


def threads_left_behind() -> list[tuple[threading.Thread, str]]:
    """The non-daemon threads user code started that are still running."""
    return [(thread, what) for thread, what in LEFT_BEHIND if thread.is_alive()]


def leave_threads_behind(code: int, end_process: bool) -> int:
    """Once a command has returned `code`: warn about threads user code left running and, when
    `end_process` (the program, not a call from Python), end the process now with `code`
    instead of letting the interpreter wait for them forever."""
    left = threads_left_behind()
    if left:
        _warn(left, "hydrappo exits without waiting for them" if end_process else "Python waits for them at exit")
        if end_process:  # every file of ours is written and closed: nothing is lost
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


COMMAND_LINE = False  # cli.main runs the command: it warns about left threads itself, once it has returned


def warn_at_end_of_run() -> None:
    """Through the Python API (a run's end): name the threads user code left running, for which
    the program will wait at exit; a library cannot end its caller's process."""
    left = threads_left_behind()
    if left and not COMMAND_LINE:
        _warn(left, "this Python program will not end until they do")


def _warn(left: list, consequence: str) -> None:
    names = ", ".join(f"{thread.name!r} (started by the {what})" for thread, what in left)
    logging.getLogger("hydrappo").warning(
        "%d thread(s) started by user code still running: %s; %s (start such threads with daemon=True, or end "
        "them before returning).",
        len(left),
        names,
        consequence,
    )


def user_frame(error: BaseException) -> str:
    """' (file.py, line N)' of the innermost frame of a traceback outside hydrappo."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "hydrappo" not in Path(f.filename).parts]
    return f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""


class TimedOut(Exception):
    pass


def call_with_timeout(fn, kwargs: dict, timeout_s: float | None):
    """fn(**kwargs), in a daemon thread when there is a time limit: a call that does not
    return in time is left behind (a thread cannot be killed) and TimedOut raised."""
    if timeout_s is None:
        return fn(**kwargs)
    import torch  # here, not at the top: config/ imports this module, and loads no torch

    box: dict = {}
    grad = torch.is_grad_enabled()

    def target():
        try:
            with torch.set_grad_enabled(grad):
                box["result"] = fn(**kwargs)
        except BaseException as error:  # handed to the caller's thread
            box["error"] = error

    thread = threading.Thread(target=target, name="hydrappo-reward-fn", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimedOut
    if "error" in box:
        raise box["error"]
    return box["result"]


# ---------------------------------------------------------------------------- loading user code
def resolve_path(path, base_dir: str | Path | None):
    """A relative path is looked up in `base_dir` (a config file's folder) first, and made absolute
    there when found; else it is left as it is, relative to the current directory (the trainer's
    rule for every path). None and in-memory values pass through unchanged."""
    if not isinstance(path, (str, Path)) or base_dir is None or Path(path).is_absolute():
        return path
    candidate = Path(base_dir) / path
    if not candidate.exists():
        return path
    return str(candidate.absolute()) if isinstance(path, str) else candidate.absolute()


def is_file_spec(target: str) -> bool:
    """Whether the part before ':' of a spec names a file (else a module importable from sys.path)."""
    return target.endswith(".py") or "/" in target or "\\" in target


def split_spec(spec: str, what: str, error: type[HydrappoError] = UsageError) -> tuple[str, str]:
    """('path/to/file.py' or 'package.module', 'name') of a spec, or `error` saying the form."""
    target, _, name = spec.rpartition(":") if isinstance(spec, str) else ("", "", "")
    if not target or not name.isidentifier():
        raise error(f"{what} {spec!r} is not of the form 'path/to/file.py:name' or 'package.module:name'.")
    return target, name


# While a run's code loads: a file's module by its resolved path, with the digest of the text it
# was imported from (None outside `one_module_per_file`: every load imports the file again).
_FILE_MODULES: dict[Path, tuple[str, object]] | None = None


@contextmanager
def one_module_per_file():
    """Within the block, every load of a file gives the module of its first import (unless its text
    changed); the outermost block decides, so nested loaders share it."""
    global _FILE_MODULES
    outer = _FILE_MODULES
    if outer is None:
        _FILE_MODULES = {}
    try:
        yield
    finally:
        _FILE_MODULES = outer


def load_module(target: str, base_dir: str | Path | None, what: str, error: type[HydrappoError] = UsageError):
    """The module `target` names: a file (a relative path is looked up beside the config first,
    `resolve_path`), imported once as user code, or a module imported from sys.path. Every way it
    can fail is `error` saying what was wrong and how to fix it."""
    if not is_file_spec(target):
        return _import_module(target, what, error)
    path = Path(resolve_path(target, base_dir))
    if not path.is_file():
        where = f" (looked in {base_dir} and the current directory)" if base_dir is not None else ""
        raise error(f"{what} file {str(path)!r} does not exist{where}.")
    path = path.resolve()
    if _FILE_MODULES is None:
        return _import_file(path, what, error)
    text_digest = hashlib.sha1(path.read_bytes()).hexdigest()
    loaded = _FILE_MODULES.get(path)
    if loaded is not None and loaded[0] == text_digest:  # the same file, unchanged: the same module
        return loaded[1]
    module = _import_file(path, what, error)
    _FILE_MODULES[path] = (text_digest, module)
    return module


def load_object(spec: str, base_dir: str | Path | None, what: str, error: type[HydrappoError] = UsageError):
    """The object `spec` ('path/to/file.py:name' or 'package.module:name') names, its module loaded
    by `load_module`; `what` names the option in messages ("reward function", "agent.tools")."""
    target, name = split_spec(spec, what, error)
    module = load_module(target, base_dir, what, error)
    if not hasattr(module, name):
        defined = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        raise error(
            f"{what} {spec!r}: {target} has no {name!r}; callables it defines: {', '.join(defined) or '(none)'}."
        )
    return getattr(module, name)


def _import_module(module_name: str, what: str, error: type[HydrappoError]):
    try:
        with running(f"{what} module {module_name!r}", at_import=True):
            return importlib.import_module(module_name)
    except UserCodeError:
        raise
    except ModuleNotFoundError as failure:
        if failure.name is None or not (module_name == failure.name or module_name.startswith(failure.name + ".")):
            raise import_failed(f"{what} module {module_name!r}", failure, error) from failure
        raise error(
            f"{what} module {module_name!r} is not importable from sys.path; install it, add its folder "
            "to PYTHONPATH, or name the file instead: 'path/to/file.py:name'."
        ) from None
    except Exception as failure:
        raise import_failed(f"{what} module {module_name!r}", failure, error) from failure


def _import_file(path: Path, what: str, error: type[HydrappoError]):
    # A unique, stable module name per file, registered in sys.modules before it runs so that
    # dataclasses, pickling and the like work inside the user's file.
    module_name = f"_hydrappo_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        with running(f"{what} file {str(path)!r}", at_import=True):
            spec.loader.exec_module(module)
    except BaseException as failure:
        del sys.modules[module_name]
        if isinstance(failure, Exception) and not isinstance(failure, UserCodeError):
            raise import_failed(f"{what} file {str(path)!r}", failure, error) from failure
        raise
    return module


def import_failed(what: str, failure: Exception, error: type[HydrappoError] = UsageError) -> HydrappoError:
    if isinstance(failure, SyntaxError):
        where = f" ({Path(failure.filename or '').name}, line {failure.lineno})"
    else:
        where = user_frame(failure)
    return error(
        f"{what} failed to import: {type(failure).__name__}: {failure}{where}. Fix it (a missing module: install it), "
        "or rerun with --debug for the traceback."
    )
