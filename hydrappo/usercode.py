"""Calling code a user wrote (a reward function): whatever it does, the trainer stays in charge.

Inside user code, `sys.exit()` and `raise KeyboardInterrupt` are bugs of that code, not requests
to end training quietly: `call` turns them into a UserCodeError naming the function and the step
(while training, Ctrl-C and SIGTERM are handled by train/interrupt.py and never raise
KeyboardInterrupt there). A non-daemon thread that user code starts and leaves running would keep
the process alive after training ends (Python waits for such threads at exit, and a thread
cannot be stopped from outside): `call` notes such threads, and the command line, once the
command has returned (every checkpoint, metrics line and log written and closed), warns about
them and ends the process with os._exit instead of waiting (cli.main). Daemon threads are left
alone: they never block the exit.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from .errors import HydrappoError

# Threads started by user code and alive when its call returned: (thread, what started it).
LEFT_BEHIND: list[tuple[threading.Thread, str]] = []


class UserCodeError(HydrappoError):
    """User code called sys.exit() or raised KeyboardInterrupt."""

    exit_code = 1


def call(fn: Callable[..., Any], what: str, /, *args, **kwargs) -> Any:
    """fn(*args, **kwargs); `what` names it in messages ("reward function 'f.py:score' at step 3")."""
    before = set(threading.enumerate())
    try:
        return fn(*args, **kwargs)
    except SystemExit as error:
        code = "" if error.code is None else repr(error.code)
        raise UserCodeError(
            f"{what} called sys.exit({code}) (SystemExit); code called by the trainer must return or raise an "
            "exception, not end the process. Return a value (or raise an error that says what went wrong)."
        ) from None
    except KeyboardInterrupt:
        raise UserCodeError(
            f"{what} raised KeyboardInterrupt; code called by the trainer must not (Ctrl-C while training stops "
            "after the current step with a checkpoint). Raise another exception that says what went wrong."
        ) from None
    finally:
        for thread in threading.enumerate():
            if thread not in before and thread.is_alive() and not thread.daemon:
                LEFT_BEHIND.append((thread, what))


def threads_left_behind() -> list[tuple[threading.Thread, str]]:
    """The non-daemon threads user code started that are still running."""
    return [(thread, what) for thread, what in LEFT_BEHIND if thread.is_alive()]


def leave_threads_behind(code: int, end_process: bool) -> int:
    """Once a command has returned `code`: warn about threads user code left running and, when
    `end_process` (the program, not a call from Python), end the process now with `code`
    instead of letting the interpreter wait for them forever."""
    left = threads_left_behind()
    if left:
        names = ", ".join(f"{thread.name!r} (started by the {what})" for thread, what in left)
        logging.getLogger("hydrappo").warning(
            "%d thread(s) started by user code still running: %s; hydrappo exits without waiting for them "
            "(start such threads with daemon=True, or end them before returning).", len(left), names)  # fmt: skip
        if end_process:  # every file of ours is written and closed: nothing is lost
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


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
