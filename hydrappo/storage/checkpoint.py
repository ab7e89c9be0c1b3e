"""Checkpoints: safetensors for weights, weights_only torch files for optimizer/RNG state.

Layout of `output_dir/checkpoint-<step>/`, the same for every stage:
    trainable.safetensors   every trainable parameter (top layers, value head, a reward branch, adapters)
    training_state.pt       optimizer, scheduler, RNG states, loss scaler and the loop's tensors
                            (loaded with weights_only=True: a checkpoint is data, never code)
    trainer_state.json      step and the loop's plain state (KL controller, score moments, data
                            position, counters; a reward branch's metadata)
    config.yaml             the configuration of the run

A checkpoint is written into a hidden temporary folder and renamed when complete
(storage/atomic.py), so a crash never leaves a half-written folder that looks like the
latest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_file

from ..errors import UsageError
from .atomic import write_directory

WEIGHTS_NAME = "trainable.safetensors"
STATE_NAME = "training_state.pt"
TRAINER_STATE_NAME = "trainer_state.json"
CONFIG_NAME = "config.yaml"
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(UsageError):
    """A checkpoint is missing, incomplete or does not fit the model."""


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints in `output_dir`, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _CHECKPOINT_DIR.match(child.name)
        if match and child.is_dir() and (child / TRAINER_STATE_NAME).is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = checkpoint_dirs(output_dir)
    return found[-1] if found else None


def find_checkpoint(path: str | Path, what: str = "checkpoint") -> Path:
    """A checkpoint folder, or the newest checkpoint in an output_dir (or in a file's folder)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{what} {str(path)!r} does not exist.")
    if path.is_file():
        path = path.parent
    if (path / TRAINER_STATE_NAME).is_file() and (path / WEIGHTS_NAME).is_file():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(
            f"{str(path)!r} is not a hydrappo {what}: it has no {WEIGHTS_NAME} and {TRAINER_STATE_NAME}, and no "
            "checkpoint-<step> folders. Point at a run's output_dir or a checkpoint-<step> folder in it."
        )
    return latest


def resolve_resume(resume: str | Path | bool, output_dir: str | Path) -> Path:
    """`--resume` (True or 'latest': the newest checkpoint in output_dir) or `--resume PATH`."""
    if resume in (True, "latest", ""):
        found = latest_checkpoint(output_dir)
        if found is None:
            raise CheckpointError(f"--resume: no checkpoint found in {output_dir}; start without --resume.")
        return found
    path = Path(resume)
    if not (path / TRAINER_STATE_NAME).is_file() or not (path / WEIGHTS_NAME).is_file():
        raise CheckpointError(
            f"{path} is not a complete hydrappo checkpoint (expected {WEIGHTS_NAME} and {TRAINER_STATE_NAME} in it)."
        )
    return path


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

    final = write_directory(root / f"checkpoint-{step}", fill, replace=True)
    for old in checkpoint_dirs(root)[: -max(1, keep_last)]:
        shutil.rmtree(old)
    return final


def load_trainable_weights(model: torch.nn.Module, path: str | Path, names: set[str] | None = None) -> None:
    """Load a checkpoint's trainable.safetensors into `model`: exactly the parameters `names`
    (default: every parameter that requires grad) must be in it, with the model's shapes."""
    path = Path(path)
    weights_file = path / WEIGHTS_NAME if path.is_dir() else path
    state = load_file(str(weights_file), device=str(next(model.parameters()).device))
    params = dict(model.named_parameters())
    expected = names if names is not None else {name for name, p in params.items() if p.requires_grad}
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights_file} does not fit this model: missing {missing[:4]}{'...' if len(missing) > 4 else ''}, "
            f"unexpected {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}. Was it written with other "
            "num_layers_unfrozen / train_lm_head / train_final_norm / LoRA settings, or for another model?"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            if params[name].shape != tensor.shape:
                raise CheckpointError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(params[name].shape)}.")
            params[name].copy_(tensor)


def load_training_state(path: str | Path) -> tuple[dict, dict]:
    """(training_state, trainer_state) of a checkpoint. Never unpickles arbitrary objects."""
    path = Path(path)
    training_state = torch.load(path / STATE_NAME, map_location="cpu", weights_only=True)
    trainer_state = json.loads((path / TRAINER_STATE_NAME).read_text())
    return training_state, trainer_state


def read_trainer_state(path: str | Path) -> dict:
    return json.loads((Path(path) / TRAINER_STATE_NAME).read_text())


def load_checkpoint_config(checkpoint: str | Path, config_cls):
    """The configuration a checkpoint was trained with (its config.yaml) as a `config_cls`;
    keys this version does not know are dropped, missing ones take their defaults."""
    path = Path(checkpoint) / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(f"{checkpoint} has no {CONFIG_NAME}: is it a hydrappo checkpoint folder (checkpoint-<step>)?")
    data = yaml.safe_load(path.read_text()) or {}
    sections = {}
    for section in dataclasses.fields(config_cls):
        cls = section.default_factory
        valid = {f.name for f in dataclasses.fields(cls)}
        sections[section.name] = cls(**{k: v for k, v in (data.get(section.name) or {}).items() if k in valid})
    return config_cls(**sections)
