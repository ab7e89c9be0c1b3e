"""The paths a config names, checked before anything is loaded: inputs exist, a reward
function's file is there, the output folder can be written.

Relative input paths were anchored at the config file's folder when the file was read
(sections.resolve_path): what is still relative here is looked up in the current directory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# File types a table source may have (data.read_table); a value with one of these suffixes,
# or starting like a path, is a path, anything else may be a `datasets` name.
TABLE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")
_WHERE = "a relative path is looked up next to the config file, then in the current directory"


def looks_like_a_path(source: str) -> bool:
    """Whether a data source that does not exist is meant as a file (an error) rather than
    a `datasets` name (loaded from its cache)."""
    return str(source).startswith(("/", ".", "~")) or Path(str(source)).suffix.lower() in TABLE_SUFFIXES


def looks_like_a_model_path(value: str) -> bool:
    """Whether a model location that does not exist is meant as a local path (an error)
    rather than a Hub id ('org/name', or a bare name): it starts like a path or is a .gguf file."""
    return value.startswith(("/", ".", "~")) or "\\" in value or value.lower().endswith(".gguf")


def hub_id_problem(value: str) -> str | None:
    """What makes `value` no Hub model id ('org/name' or 'name'), or None when it is one;
    huggingface_hub's own rule decides."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        return (
            "is no local folder and no Hub model id (ORG/NAME: one '/', letters, digits, '-', '_' and '.', "
            "no '--' or '..', at most 96 characters)"
        )
    return None


def _missing(problems, label: str, value, what: str) -> None:
    problems.add(label, value, f"does not exist: no such {what} ({_WHERE}, {os.getcwd()})", "fix the path")


def writable_folder_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be (or become) a folder this process writes into; None when it can."""
    path = Path(path).expanduser().absolute()
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder"
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, so no folder can be made below it"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def check_model_location(problems, label: str, value: str, what: str) -> bool:
    """A model or tokenizer location: an existing path, else a Hub id (resolved when it
    loads: from the Hugging Face cache, or downloaded). True when `value` names a Hub id."""
    if Path(value).expanduser().exists():
        return False
    if looks_like_a_model_path(value):
        _missing(problems, label, value, what)
        return False
    problem = hub_id_problem(value)
    if problem:
        problems.add(label, value, problem, "correct the Hub id, or give the path of an existing folder")
    return problem is None


def check_paths(config, problems) -> None:
    """Every path option of a config: inputs must exist (model locations may be Hub ids), the
    output folder must be writable."""
    model = config.model
    name = model.name_or_path
    if not name:
        problems.add(
            "model.name_or_path",
            name,
            "is required",
            "name a model directory, a .gguf file, a bundled model or a Hub id (ORG/NAME)",
        )
    elif not check_model_location(problems, "model.name_or_path", name, "model directory or .gguf file"):
        folder = Path(name).expanduser()
        if model.gguf_file and folder.is_dir() and not (folder / model.gguf_file).is_file():
            problems.add(
                "model.gguf_file",
                model.gguf_file,
                f"is not a file in model.name_or_path ({name})",
                "name the .gguf file inside that folder",
            )
        if getattr(model, "revision", None) and folder.exists():
            problems.add(
                "model.revision",
                model.revision,
                f"applies only to a Hub id, and model.name_or_path={name} is a local path",
                "remove model.revision",
            )
    lora = getattr(config, "lora", None)
    reward = getattr(config, "reward", None)
    if model.tokenizer_name_or_path:
        check_model_location(problems, "model.tokenizer_name_or_path", model.tokenizer_name_or_path, "tokenizer folder")
    if reward is not None and reward.reward_model:
        check_model_location(problems, "reward.reward_model", reward.reward_model, "reward model folder")
    for label, value, what in (
        ("model.reward_branch_path", model.reward_branch_path, "reward checkpoint or reward run folder"),
        ("lora.lora_init_adapter", lora.lora_init_adapter if lora is not None else None, "adapter folder"),
    ):
        if value and not Path(value).expanduser().exists():
            _missing(problems, label, value, what)
    if reward is not None and reward.reward_fn:
        for spec in reward.function_specs:
            check_reward_fn(spec, problems)
    data = config.data
    for name in ("prompts", "eval_prompts", "train_file", "eval_file", "stats_file"):
        value = getattr(data, name, None)
        if isinstance(value, str) and value and not Path(value).expanduser().exists() and looks_like_a_path(value):
            _missing(problems, f"data.{name}", value, "file or folder")
    problem = writable_folder_problem(config.train.output_dir)
    if problem:
        problems.add(
            "train.output_dir",
            config.train.output_dir,
            f"cannot hold the run's files: {problem}",
            "choose another output_dir (a new or empty folder)",
        )


def check_reward_fn(spec, problems, label: str = "reward.reward_fn") -> None:
    """'module:function' or 'path/to/file.py:function'; a file must exist. A function
    object (given through the Python API) is taken as it is."""
    if callable(spec):
        return
    target, _, function = str(spec).rpartition(":")
    if not target or not function.isidentifier():
        problems.add(
            label,
            spec,
            "must be 'module:function' or 'path/to/file.py:function'",
            "name the function after a colon, e.g. reward.py:reward_fn",
        )
        return
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    if is_file and not Path(target).expanduser().is_file():
        _missing(problems, label, spec, f"file {target!r}")


# ---------------------------------------------------------------------------- what a run reads
# The folder of a run's output_dir where a tokenizer given as an object (the Python API's processing_class)
# is saved, and which model.tokenizer_name_or_path then names (storage/run_tokenizer.py).
RUN_TOKENIZER = "tokenizer"


def run_tokenizer_path(output_dir: str | os.PathLike) -> str:
    """The absolute path of the tokenizer folder of the run in `output_dir`."""
    return str(Path(output_dir).expanduser().absolute() / RUN_TOKENIZER)


def besides_run_tokenizer(inputs: dict[str, str], output_dir) -> dict[str, str]:
    """`inputs` ({option: path}) without the run's own saved tokenizer folder, which output_dir holds by design."""
    own = run_tokenizer_path(output_dir)
    return {name: path for name, path in inputs.items() if str(path) != own}


def names_run_tokenizer(config) -> bool:
    """Whether model.tokenizer_name_or_path names the run's own saved tokenizer (run_tokenizer_path)."""
    tokenizer = config.model.tokenizer_name_or_path
    return bool(tokenizer) and str(tokenizer) == run_tokenizer_path(config.train.output_dir)


def input_paths(config) -> dict[str, str]:
    """{option: path} of the inputs a run keeps reading (its config.PATHS): its output folder
    must never be, contain or lie inside one of them. Objects given through the Python API (a
    dataset, a list of rows) are no paths and are left out."""
    paths = {}
    for entry in config.PATHS:
        section, name = entry.split(".")
        value = getattr(getattr(config, section, None), name, None)
        if isinstance(value, (str, os.PathLike)) and str(value):
            paths[entry] = str(value)
    return paths


def startup_inputs(config) -> dict[str, str]:
    """{what: path} of the files a run reads once as it starts: the config file and the code of
    every reward function (a file a spec names, the module file an import would find, the
    file that defines a function object). Its output folder must not be moved aside with them."""
    paths = {}
    if getattr(config, "config_file", None):
        paths["the config file"] = str(config.config_file)
    reward = getattr(config, "reward", None)
    for spec in reward.function_specs if reward is not None else []:
        if callable(spec):
            file = getattr(sys.modules.get(getattr(spec, "__module__", "") or ""), "__file__", None)
            label = f"the file of reward function {getattr(spec, '__qualname__', spec)!r}"
        else:
            target = spec.rpartition(":")[0]
            is_file = target.endswith(".py") or "/" in target or "\\" in target
            file = target if is_file else module_file(target)
            label = f"reward.reward_fn={spec!r}"
        if file:
            paths[label] = str(file)
    return paths


def module_file(name: str) -> str | None:
    """The file an import of module `name` would run (found on sys.path as importlib would,
    without importing it or its packages), or None."""
    if not all(part.isidentifier() for part in name.split(".")):
        return None
    if name in sys.modules:
        return getattr(sys.modules[name], "__file__", None)
    from importlib.machinery import PathFinder

    parts, locations, spec = name.split("."), None, None
    for depth in range(1, len(parts) + 1):
        spec = PathFinder.find_spec(".".join(parts[:depth]), locations)
        if spec is None:
            return None
        locations = spec.submodule_search_locations
        if depth < len(parts) and locations is None:
            return None
    return spec.origin if spec.has_location else None
