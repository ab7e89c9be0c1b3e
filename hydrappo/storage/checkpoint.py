"""Checkpoints: safetensors for weights, weights_only torch files for optimizer/RNG state.

Layout of `output_dir/checkpoint-<step>/`, the same for every stage:
    trainable.safetensors   every trainable parameter (top layers, value head, a reward branch, adapters)
    training_state.pt       optimizer, scheduler, RNG states, loss scaler and the loop's tensors
                            (loaded with weights_only=True: a checkpoint is data, never code)
    trainer_state.json      step and the loop's plain state (KL controller, score moments, data
                            position, counters; a reward branch's metadata)
    config.yaml             the configuration of the run
    manifest.json           the size and SHA-256 of every other file, written last

A checkpoint is written into a hidden temporary folder and renamed when complete
(storage/atomic.py), so a crash never leaves a half-written folder that looks like the
latest checkpoint. What happens to a folder afterwards (a disk that filled up while it was
copied, a file deleted by hand) the manifest catches: `checkpoint_problems` lists what is
wrong with one, and every command that loads a checkpoint refuses a damaged one, except
`--resume` of the latest, which skips it (moved aside, with a warning) for the newest
complete one. Checkpoints written before manifests existed are checked by what they hold:
the files exist and parse.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ..errors import UsageError, plain_write_errors, spell
from .atomic import refuse_symlink, rename_to_sibling, temporary_prefix, write_directory
from .resume import resume_changes

logger = logging.getLogger("hydrappo")

WEIGHTS_NAME = "trainable.safetensors"
STATE_NAME = "training_state.pt"
TRAINER_STATE_NAME = "trainer_state.json"
CONFIG_NAME = "config.yaml"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(UsageError):
    """A checkpoint is missing, incomplete, damaged or does not fit the model."""


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """The checkpoint-<step> folders in `output_dir`, oldest first (damaged ones too: see
    `checkpoint_problems`)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _CHECKPOINT_DIR.match(child.name)
        if match and child.is_dir() and not child.is_symlink():  # a link is not a checkpoint this run wrote
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def refuse_foreign_checkpoint_entries(output_dir: str | Path) -> None:
    """A run refuses, before it trains, an output_dir entry named like a checkpoint that is a
    symbolic link or a file: it would meet it when it saves that step (atomic.refuse_symlink)."""
    root = Path(output_dir)
    if root.is_dir():
        for child in sorted(root.iterdir()):
            if _CHECKPOINT_DIR.match(child.name):
                refuse_symlink(child)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = checkpoint_dirs(output_dir)
    return found[-1] if found else None


def latest_complete_checkpoint(output_dir: str | Path, for_resume: bool = True) -> Path | None:
    """The newest checkpoint of `output_dir` that `checkpoint_problems` finds nothing wrong with."""
    for folder in reversed(checkpoint_dirs(output_dir)):
        if not checkpoint_problems(folder, for_resume=for_resume):
            return folder
    return None


# --------------------------------------------------------------------------- integrity
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: str | Path) -> None:
    """Record the size and SHA-256 of every file of a checkpoint folder (written last, before
    the folder is renamed into place)."""
    folder = Path(folder)
    files = {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST_NAME
    }
    (folder / MANIFEST_NAME).write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1) + "\n")


def _parse_problem(folder: Path, name: str) -> str | None:
    """Why a checkpoint file does not parse (None when it does). Nothing is unpickled."""
    path = folder / name
    try:
        if name == WEIGHTS_NAME:
            with safe_open(str(path), "pt") as handle:
                handle.keys()
        elif name == STATE_NAME:
            with zipfile.ZipFile(path) as archive:  # torch.save's format; testzip checks every CRC
                bad = archive.testzip()
            if bad is not None:
                return f"{name} is corrupted (member {bad})"
        elif name == TRAINER_STATE_NAME:
            state = json.loads(path.read_text())
            if not isinstance(state, dict) or "step" not in state:
                return f"{name} holds no step"
        elif name == CONFIG_NAME:
            yaml.safe_load(path.read_text())
    except (OSError, ValueError, SafetensorError, zipfile.BadZipFile, yaml.YAMLError, EOFError) as error:
        return f"{name} does not parse ({type(error).__name__}: {str(error)[:120]})"
    return None


def _outside_problem(folder: Path, name: str) -> str | None:
    """Why a manifest entry is not a file of the checkpoint folder itself (None when it is): an
    entry is a relative path of plain names (a LoRA adapter's files lie in adapter/), none of
    them `..`, and no part of it a symbolic link. Nothing outside the folder is read or hashed."""
    parts = name.split("/")
    plain = name and "\\" not in name and not Path(name).is_absolute() and all(p not in ("", ".", "..") for p in parts)
    if not plain:
        return f"{MANIFEST_NAME} lists {name!r}, which is not a plain file name inside the checkpoint folder"
    for depth in range(1, len(parts) + 1):
        if (folder.joinpath(*parts[:depth])).is_symlink():
            return f"{MANIFEST_NAME} lists {name!r}, which is a symbolic link (a checkpoint holds none)"
    return None


def checkpoint_problems(folder: str | Path, for_resume: bool = True) -> list[str]:
    """What is wrong with a checkpoint folder (empty when nothing is).

    With a manifest, every file it lists must be there with its size and SHA-256. Without
    one (checkpoints written before manifests existed) the files a checkpoint needs must
    exist and parse. `for_resume` also requires the optimizer state (training_state.pt);
    export and generation need only the weights, the trainer state and the config."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    required = [WEIGHTS_NAME, TRAINER_STATE_NAME] + ([STATE_NAME] if for_resume else [])
    problems = [f"{name} is missing" for name in required if not (folder / name).is_file()]
    manifest_path = folder / MANIFEST_NAME
    if not manifest_path.is_file():
        if not problems:
            present = [name for name in (*required, CONFIG_NAME) if (folder / name).is_file()]
            problems += [p for p in (_parse_problem(folder, name) for name in present) if p]
        return problems
    try:
        files = json.loads(manifest_path.read_text())["files"]
        entries = [(name, int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return problems + [f"{MANIFEST_NAME} does not parse"]
    for name, size, digest in entries:
        path = folder / name
        outside = _outside_problem(folder, name)
        if outside:
            problems.append(outside)
        elif not path.is_file():
            if f"{name} is missing" not in problems:
                problems.append(f"{name} is missing")
        elif path.stat().st_size != size:
            problems.append(f"{name} has {path.stat().st_size} bytes, not the {size} it was written with (cut short?)")
        elif _sha256(path) != digest:
            problems.append(f"{name} differs from what was written (its SHA-256 does not match {MANIFEST_NAME})")
    return problems


def _damaged(folder: Path, problems: list[str], what: str = "checkpoint") -> CheckpointError:
    newest = latest_complete_checkpoint(folder.parent)  # never `folder`: its problems stand for resume too
    hint = (
        f"The newest complete checkpoint of that run is {newest}: use it."
        if newest
        else f"No complete checkpoint is left in {folder.parent}."
    )
    return CheckpointError(f"{what} {folder} is damaged: {'; '.join(problems)}. {hint}")


def is_checkpoint_folder(path: Path) -> bool:
    """A checkpoint-<step> folder, or a folder holding a checkpoint's files."""
    return bool(_CHECKPOINT_DIR.match(path.name)) or any(
        (path / name).is_file() for name in (TRAINER_STATE_NAME, WEIGHTS_NAME, MANIFEST_NAME)
    )


def find_checkpoint(path: str | Path, what: str = "checkpoint", verify: bool = True, for_resume: bool = False) -> Path:
    """A checkpoint folder, or the newest checkpoint in an output_dir (or in a file's folder).
    With `verify`, a damaged checkpoint is a CheckpointError that names what is wrong."""
    given = path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{what} {str(path)!r} does not exist.")
    if path.is_file():
        path = path.parent
    if is_checkpoint_folder(path):
        folder = path
    else:
        folder = latest_checkpoint(path)
        if folder is None:
            # Name what the user gave: a file that is no checkpoint's file is the mistake, not its folder.
            kind = f"a file, not a hydrappo {what} (a folder)" if given.is_file() else f"not a hydrappo {what}"
            raise CheckpointError(
                f"{str(given)!r} is {kind}: {'its folder' if given.is_file() else 'it'} has no {WEIGHTS_NAME} and "
                f"{TRAINER_STATE_NAME}, and no checkpoint-<step> folders. Point at a run's output_dir or a "
                "checkpoint-<step> folder in it."
            )
    if verify:
        problems = checkpoint_problems(folder, for_resume=for_resume)
        if problems:
            raise _damaged(folder, problems, what)
    return folder


def set_aside_damaged(folder: Path) -> Path:
    """Rename a damaged checkpoint-<step> to checkpoint-<step>.damaged-<time>: kept for a look,
    no longer counted as a checkpoint (keep-last, --resume)."""
    return rename_to_sibling(folder, "damaged")


def resolve_resume(resume: str | Path | bool, output_dir: str | Path, set_aside: bool = True) -> Path:
    """`--resume` (True or 'latest': the newest complete checkpoint in output_dir; damaged
    newer ones are set aside with a warning) or `--resume PATH` (a damaged one is an error).
    `set_aside=False` (every process of a launcher run but process 0): skip them, rename nothing."""
    if resume in (True, "latest", ""):
        found = checkpoint_dirs(output_dir)
        if not found:
            raise CheckpointError(
                f"{spell('resume')}: no checkpoint found in {output_dir}; start without {spell('resume')}."
            )
        for folder in reversed(found):
            problems = checkpoint_problems(folder)
            if not problems:
                return folder
            if not set_aside:
                continue
            aside = set_aside_damaged(folder)
            logger.warning(
                "%s: skipping the damaged checkpoint %s (%s); it was moved to %s",
                spell("resume"),
                folder,
                "; ".join(problems),
                aside.name,
            )
        raise CheckpointError(
            f"{spell('resume')}: every checkpoint in {output_dir} is damaged (moved aside as "
            f"checkpoint-<step>.damaged-*); start a new run with {spell('train.overwrite_output_dir')}, or resume from "
            f"a copy with {spell('resume', 'PATH')}."
        )
    path = Path(resume).expanduser()
    if not path.is_dir():
        raise CheckpointError(
            f"{spell('resume', path)}: no such checkpoint folder; give a checkpoint-<step> folder, or "
            f"{spell('resume')} for the latest."
        )
    if not is_checkpoint_folder(path):
        raise CheckpointError(
            f"{spell('resume', path)}: not a checkpoint folder (no {WEIGHTS_NAME}, {TRAINER_STATE_NAME}); give a "
            "checkpoint-<step> folder."
        )
    problems = checkpoint_problems(path)
    if problems:
        raise _damaged(path, problems, f"{spell('resume', path)}: the checkpoint")
    return path


def resume_check(checkpoint: Path, config) -> list[str]:
    """The options of `config` that differ from those `checkpoint` was trained with (storage/resume.py);
    CheckpointError naming them when one of them may not change. Nothing loads: the command line
    asks before the model is built, the harness again before the checkpoint's weights load."""
    refusals, changes = resume_changes(Path(checkpoint) / CONFIG_NAME, config)
    if refusals:
        raise CheckpointError(f"{spell('resume', checkpoint)}: " + " ".join(f"{refusal}." for refusal in refusals))
    return changes


def trainable_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().contiguous() for name, p in model.named_parameters() if p.requires_grad}


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (random-init models are rebuilt from a run's seed)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    numpy_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        # weights_only loading accepts tensors and plain values, not numpy arrays.
        "numpy": (numpy_state[0], torch.from_numpy(numpy_state[1].copy()), *numpy_state[2:]),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy(), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    weights: dict[str, torch.Tensor],
    training_state: dict,
    trainer_state: dict,
    config_yaml: str,
    keep_last: int = 2,
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint-<step> atomically, then delete all but the newest `keep_last`.
    `write_extra(folder)` may add files (e.g. a peft adapter) before the rename."""
    root = Path(output_dir)

    def fill(folder: Path) -> None:
        save_file(weights, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
        torch.save(training_state, folder / STATE_NAME)
        (folder / TRAINER_STATE_NAME).write_text(json.dumps(dict(trainer_state, step=step), indent=2))
        (folder / CONFIG_NAME).write_text(config_yaml)
        if write_extra is not None:
            write_extra(folder)
        write_manifest(folder)

    with run_write_errors(f"the checkpoint at step {step}", root):
        final = write_directory(root / f"checkpoint-{step}", fill, replace=True)
    for old in checkpoint_dirs(root)[: -max(1, keep_last)]:
        # Renamed to a hidden temporary first: a crash while deleting leaves no half a checkpoint.
        doomed = old.with_name(f"{temporary_prefix(old.name, 'old')}rotated")
        os.replace(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return final


def run_write_errors(what: str, where: Path):
    """errors.plain_write_errors for a run's files (a checkpoint in output_dir, its metrics.jsonl),
    saying which checkpoints survive and how to continue."""
    newest = latest_checkpoint(where if where.is_dir() else where.parent)
    if newest is None:
        return plain_write_errors(
            what, where, "no checkpoint of this run was written yet; metrics.jsonl is intact", "and run again"
        )
    return plain_write_errors(
        what,
        where,
        f"the run's checkpoints are intact (the newest: {newest.name}), and so is metrics.jsonl",
        f"and continue with {spell('resume')}",
    )


def load_trainable_weights(model: torch.nn.Module, path: str | Path, names: set[str] | None = None) -> None:
    """Load a checkpoint's trainable.safetensors into `model`: exactly the parameters `names`
    (default: every parameter that requires grad) must be in it, with the model's shapes."""
    path = Path(path)
    weights_file = path / WEIGHTS_NAME if path.is_dir() else path
    try:
        state = load_file(str(weights_file), device=str(next(model.parameters()).device))
    except (OSError, SafetensorError) as error:
        raise CheckpointError(
            f"{weights_file} cannot be read ({type(error).__name__}: {error}); the checkpoint is damaged."
        ) from None
    params = dict(model.named_parameters())
    expected = names if names is not None else {name for name, p in params.items() if p.requires_grad}
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights_file} does not fit this model: missing {missing[:4]}{'...' if len(missing) > 4 else ''}, "
            f"unexpected {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}. Was it written with other "
            "num_layers_unfrozen / trainable_layers / train_lm_head / train_final_norm / LoRA settings, or for another model?"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            if params[name].shape != tensor.shape:
                raise CheckpointError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(params[name].shape)}."
                )
            params[name].copy_(tensor)


def load_training_state(path: str | Path) -> tuple[dict, dict]:
    """(training_state, trainer_state) of a checkpoint. Never unpickles arbitrary objects."""
    path = Path(path)
    try:
        training_state = torch.load(path / STATE_NAME, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path / STATE_NAME} holds objects other than tensors and plain values, which hydrappo never unpickles "
            f"(a checkpoint is data, not code): {str(error).splitlines()[0]}"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as error:
        raise CheckpointError(
            f"{path / STATE_NAME} cannot be read ({type(error).__name__}); the checkpoint is damaged."
        ) from None
    return training_state, read_trainer_state(path)


def read_trainer_state(path: str | Path) -> dict:
    file = Path(path) / TRAINER_STATE_NAME
    try:
        state = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"{file} cannot be read ({type(error).__name__}: {error}); the checkpoint is damaged."
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{file} is not a JSON object; the checkpoint is damaged.")
    return state


def load_checkpoint_config(checkpoint: str | Path, config_cls):
    """The configuration a checkpoint was trained with (its config.yaml) as a `config_cls`;
    keys this version does not know are dropped, missing ones take their defaults."""
    path = Path(checkpoint) / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(
            f"{checkpoint} has no {CONFIG_NAME}: is it a hydrappo checkpoint folder (checkpoint-<step>)?"
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
        sections = {}
        for section in dataclasses.fields(config_cls):
            cls = section.default_factory
            valid = {f.name for f in dataclasses.fields(cls)}
            sections[section.name] = cls(**{k: v for k, v in (data.get(section.name) or {}).items() if k in valid})
    except (OSError, ValueError, yaml.YAMLError, AttributeError, TypeError) as error:
        raise CheckpointError(
            f"{path} cannot be read as a run's config ({type(error).__name__}); the checkpoint is damaged."
        ) from None
    return config_cls(**sections)
