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
"""

from __future__ import annotations

import argparse
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

import torch

from .errors import HydrappoError

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
