"""Loading a user's reward function from "package.module:function" or "path/to/file.py:function"
(rewards.FunctionReward calls it): the import runs as user code (usercode.running), and every way
it can fail is one RewardError that says what was wrong and how to fix it."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from . import usercode
from .errors import RewardError


def resolve_path(path: str, base_dir: str | Path | None) -> Path:
    """Relative paths are relative to `base_dir` (a config file's folder) when the file
    exists there, else to the current directory (the trainer's rule for all paths)."""
    candidate = Path(path)
    if base_dir is not None and not candidate.is_absolute() and (Path(base_dir) / candidate).exists():
        return Path(base_dir) / candidate
    return candidate


def load_reward_function(spec: str, base_dir: str | Path | None = None):
    """(the function, its name) that `spec` names: "package.module:function" (imported from
    sys.path) or "path/to/file.py:function" (loaded from the file; a relative path is relative to
    `base_dir` if the file is there, else to the current directory). The import runs as user code."""
    target, _, name = spec.rpartition(":")
    if not target or not name.isidentifier():
        raise RewardError(
            f"reward function {spec!r} is not of the form 'package.module:function' or 'path/to/file.py:function'."
        )
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    module = _load_file(resolve_path(target, base_dir), base_dir) if is_file else _import_module(target)
    if not hasattr(module, name):
        defined = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        raise RewardError(
            f"reward function {spec!r}: {target} has no {name!r}; callables it defines: {', '.join(defined) or '(none)'}."
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise RewardError(f"reward function {spec!r}: {name!r} is not callable (it is {type(fn).__name__} {fn!r}).")
    return fn, name


def _import_module(module_name: str):
    try:
        with usercode.running(f"reward function module {module_name!r}", at_import=True):
            return importlib.import_module(module_name)
    except usercode.UserCodeError:
        raise
    except ModuleNotFoundError as error:
        if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
            raise import_failed(f"reward function module {module_name!r}", error) from error
        raise RewardError(
            f"reward function module {module_name!r} is not importable from sys.path; install it, add its folder "
            "to PYTHONPATH, or name the file instead: 'path/to/file.py:function'."
        ) from None
    except Exception as error:
        raise import_failed(f"reward function module {module_name!r}", error) from error


def _load_file(path: Path, base_dir):
    if not path.is_file():
        where = f" (looked in {base_dir} and the current directory)" if base_dir is not None else ""
        raise RewardError(f"reward function file {str(path)!r} does not exist{where}.")
    path = path.resolve()
    # A unique, stable module name per file, registered in sys.modules before it runs
    # so that dataclasses, pickling and the like work inside the user's file.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    module_name = f"_hydrappo_reward_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        with usercode.running(f"reward function file {str(path)!r}", at_import=True):
            spec.loader.exec_module(module)
    except BaseException as error:
        del sys.modules[module_name]
        if isinstance(error, Exception) and not isinstance(error, usercode.UserCodeError):
            raise import_failed(f"reward function file {str(path)!r}", error) from error
        raise
    return module


def import_failed(what: str, error: Exception) -> RewardError:
    if isinstance(error, SyntaxError):
        where = f" ({Path(error.filename or '').name}, line {error.lineno})"
    else:
        where = usercode.user_frame(error)
    return RewardError(
        f"{what} failed to import: {type(error).__name__}: {error}{where}. Fix it (a missing module: install it), "
        "or rerun with --debug for the traceback."
    )
