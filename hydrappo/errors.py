"""The one base class of every error hydrappo raises on purpose.

An error of this kind carries a message that says what was wrong and how to fix it; the
command line prints just that message (no traceback) and exits with `exit_code`: 2 for
a usage error (an option, a path, a file a user gave), 1 for a failure while running.
Anything else that escapes is a bug, and its traceback is what a report needs.
"""

from __future__ import annotations


class HydrappoError(Exception):
    """Raised on purpose, with a message for the user."""

    exit_code = 1


class UsageError(HydrappoError, ValueError):
    """Something the user gave (an option, a path, a file) cannot be used as it is."""

    exit_code = 2
