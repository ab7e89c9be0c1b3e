"""Checkpoints: safetensors for weights, weights_only torch files for optimizer/RNG state.

Layout of `output_dir/checkpoint-<step>/`:
    trainable.safetensors   every trainable parameter of the hydra (top layers, value head, ...)
    training_state.pt       optimizer, scheduler, RNG states (loaded with weights_only=True)
    trainer_state.json      step, KL controller, score moments, data position, counters
    config.yaml             the configuration of the run

A checkpoint is written into a hidden temporary folder and renamed when complete, so
a crash never leaves a half-written folder that looks like the latest checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

WEIGHTS_NAME = "trainable.safetensors"
STATE_NAME = "training_state.pt"
TRAINER_STATE_NAME = "trainer_state.json"
CONFIG_NAME = "config.yaml"
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(ValueError):
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


def trainable_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().contiguous() for name, p in model.named_parameters() if p.requires_grad}


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
    model: torch.nn.Module,
    training_state: dict,
    trainer_state: dict,
    config_yaml: str,
    keep_last: int = 2,
    weights: dict[str, torch.Tensor] | None = None,
    write_extra=None,
) -> Path:
    """Write checkpoint-<step> atomically, then delete all but the newest `keep_last`.
    `write_extra(folder)` may add files (e.g. a peft adapter) before the rename."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"checkpoint-{step}"
    tmp = root / f".checkpoint-{step}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file(weights if weights is not None else trainable_state_dict(model), str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
    torch.save(training_state, tmp / STATE_NAME)
    (tmp / TRAINER_STATE_NAME).write_text(json.dumps(dict(trainer_state, step=step), indent=2))
    (tmp / CONFIG_NAME).write_text(config_yaml)
    if write_extra is not None:
        write_extra(tmp)
    if final.exists():
        # Only replaced after the new one is complete.
        stale = root / f".checkpoint-{step}.stale-{os.getpid()}"
        final.rename(stale)
        tmp.rename(final)
        shutil.rmtree(stale)
    else:
        tmp.rename(final)
    for old in checkpoint_dirs(root)[: -max(1, keep_last)]:
        shutil.rmtree(old)
    return final


def resolve_checkpoint(path_or_latest: str | Path, output_dir: str | Path) -> Path:
    """`latest` (or True) means the newest checkpoint in output_dir."""
    if path_or_latest in (True, "latest", "", None):
        found = latest_checkpoint(output_dir)
        if found is None:
            raise CheckpointError(f"--resume: no checkpoint found in {output_dir}; start without --resume.")
        return found
    path = Path(path_or_latest)
    if not (path / TRAINER_STATE_NAME).is_file() or not (path / WEIGHTS_NAME).is_file():
        raise CheckpointError(
            f"{path} is not a complete hydrappo checkpoint (expected {WEIGHTS_NAME} and {TRAINER_STATE_NAME} in it)."
        )
    return path


def load_trainable_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load trainable.safetensors into `model`; every trainable parameter must be there."""
    path = Path(path)
    weights_file = path / WEIGHTS_NAME if path.is_dir() else path
    state = load_file(str(weights_file), device=str(next(model.parameters()).device))
    expected = {name for name, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights_file} does not fit this model: missing {missing[:4]}{'...' if len(missing) > 4 else ''}, "
            f"unexpected {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}. Was it written with other "
            "num_layers_unfrozen / train_lm_head / train_final_norm settings?"
        )
    params = dict(model.named_parameters())
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
