"""Which task libraries a run can name (task.task_library), one line each, and the one function
that builds a run's task from its config section.

A library is a class implementing tasks/base.py's Task, named as "module:Class" and imported only
when a run names it: a library whose package is not installed costs nothing until then.
"""

from __future__ import annotations

import importlib

from ..config.options import ConfigError
from ..config.task import TaskArgs
from .base import Task

LIBRARIES: dict[str, str] = {  # task.task_library -> "module:Class" (a tasks/base.py Task)
    "reasoning_gym": "hydrappo.tasks.reasoning_gym:ReasoningGymTask",
}


def task_class(library: str) -> type[Task]:
    """The Task class of `library`, imported now; a ConfigError naming the known libraries for an unknown one."""
    if library not in LIBRARIES:
        raise ConfigError(
            f"task.task_library={library!r} is not a task library; the known ones: {', '.join(sorted(LIBRARIES))}."
        )
    module, _, name = LIBRARIES[library].partition(":")
    return getattr(importlib.import_module(module), name)


def task_from_args(task_args: TaskArgs) -> Task:
    """The task a config's `task:` section describes, made by the library it names."""
    return task_class(task_args.task_library).from_args(task_args)
