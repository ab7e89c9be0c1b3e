"""What every rule of the config's one validation pass (config/checks.py and the modules it calls)
shares: the problems found so far, a field's default for the fix, the launch's process count, and
warnings said once per process."""

from __future__ import annotations

import dataclasses
import logging
import os

from ..errors import Problem
from .options import ConfigError

logger = logging.getLogger("hydrappo")
_warned: set[str] = set()


class Problems:
    """The problems found in one pass; `raise_if_any` raises them as one ConfigError."""

    def __init__(self):
        self.messages: list[str] = []

    def add(self, option: str, value, rule: str, fix: str) -> None:
        """One problem, as `option=value rule; fix.`"""
        self.report(Problem(option, value, rule, fix))

    def report(self, *found: Problem | None) -> None:
        """Problems a rule written elsewhere found (None: it holds)."""
        self.messages.extend(str(problem) for problem in found if problem is not None)

    def note(self, message: str) -> None:
        self.messages.append(message)

    def raise_if_any(self, where: str = "the config") -> None:
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            listed = "\n".join(f"  - {message}" for message in self.messages)
            raise ConfigError(f"{len(self.messages)} problems in {where}:\n{listed}")


def default_of(cls, name: str):
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None


def launched_processes() -> int:
    """WORLD_SIZE as a launcher (torchrun, accelerate launch) set it; 1 without one."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)
