"""Which options a resumed run may change, and how a changed one is reported.

A checkpoint holds the configuration of its run (config.yaml). `--resume` compares it with
this run's, option by option: the command line before the model is built, the harness again
before the checkpoint's weights load (through the Python API, `train(resume=...)` comes after
the trainer built its model):

- refused: an option that decides what the checkpoint holds or what its state means (which
  weights: the model, num_layers_unfrozen or trainable_layers, train_lm_head/final_norm, LoRA's shape and scale;
  whose state: the optimizer, the KL controller, the advantage estimator with or without a
  value head; what the data position counts: a supervised stage's batch_size; a random
  model's seed). The message names the option, both values and what to do.
- warned about: everything else, e.g. learning_rate, total_steps, save_every, logging and
  evaluation options, generation settings. They take effect from the next step (the harness
  applies changed optimizer hyper-parameters over the ones the checkpoint's optimizer state
  carries); the few that only act at step 0 say that they change nothing.
- silent: where the run writes and how it shows progress (output_dir, overwrite_output_dir,
  progress_bar, dist_timeout_s), and model.tokenizer_name_or_path naming another run folder's copy of
  the same saved tokenizer (storage/run_tokenizer.py: a run resumed from a checkpoint elsewhere).

Options missing on one side (a checkpoint written by another version) are not compared.
"""

from __future__ import annotations

import json
from pathlib import Path

_WEIGHTS = "it decides which weights the checkpoint holds"

# "section.option" -> why it may not change on resume
REFUSED = {
    "model.gguf_file": "the checkpoint's weights were trained on that model",
    "model.random_init": "the checkpoint's weights were trained on that model",
    "model.num_layers_unfrozen": _WEIGHTS,
    "model.trainable_layers": _WEIGHTS,
    "model.train_lm_head": _WEIGHTS,
    "model.train_final_norm": _WEIGHTS,
    "model.layers_path": _WEIGHTS,
    "lora.lora_r": _WEIGHTS,
    "lora.lora_target_modules": _WEIGHTS,
    "lora.lora_layers": _WEIGHTS,
    "lora.lora_alpha": "it scales the adapters the checkpoint holds (scale = alpha / r)",
    "ppo.advantage_estimator": "it decides whether the checkpoint holds a value head (a critic) and what its state means",
    "ppo.optimizer": "the checkpoint's optimizer state is that optimizer's",
    "train.optimizer": "the checkpoint's optimizer state is that optimizer's",
    "ppo.kl_controller": "the checkpoint holds that KL controller's state",
    "train.batch_size": "the checkpoint's data position counts batches of that size",
    "train.pooling": "the checkpoint's reward head was trained reading the branch that way",
}

# Options that only act when a run starts: a resumed run continues from the checkpoint's state.
AT_START_ONLY = {
    "ppo.init_kl_coef": "the KL coefficient continues from the checkpoint's",
    "model.value_head_init": "the value head is the checkpoint's",
    "lora.lora_init_adapter": "the adapters are the checkpoint's",
    "train.seed": "the data order and every random state continue from the checkpoint's",
}

SILENT = {"train.output_dir", "train.overwrite_output_dir", "train.progress_bar", "train.dist_timeout_s"}


def _flat(config: dict) -> dict:
    return {
        f"{section}.{name}": value
        for section, options in config.items()
        if isinstance(options, dict)
        for name, value in options.items()
    }


def _same_model(old, new) -> bool | None:
    """Whether two model.name_or_path values name the same model: True/False, or None when it
    cannot be told (the checkpoint's folder is gone, e.g. the project was moved)."""
    old_path, new_path = Path(str(old)).expanduser(), Path(str(new)).expanduser()
    if not old_path.exists():
        return None if new_path.exists() else False
    if not new_path.exists():
        return False
    try:
        return json.loads((old_path / "config.json").read_text()) == json.loads((new_path / "config.json").read_text())
    except (OSError, ValueError):
        return old_path.resolve() == new_path.resolve()


def _same_run_tokenizer(old, new) -> bool:
    """Whether two model.tokenizer_name_or_path values are run tokenizer folders (the tokenizer a run
    was given in Python, saved in its output_dir: storage/run_tokenizer.py) with the same files: the
    same tokenizer, saved in another run's folder (a run resumed from a checkpoint elsewhere)."""
    from ..config.paths import RUN_TOKENIZER

    folders = [Path(str(value)).expanduser() for value in (old, new)]
    if not all(folder.name == RUN_TOKENIZER and folder.is_dir() for folder in folders):
        return False
    files = [{path.name: path for path in folder.iterdir() if path.is_file()} for folder in folders]
    return files[0].keys() == files[1].keys() and all(
        files[0][name].read_bytes() == files[1][name].read_bytes() for name in files[0]
    )


def resume_differences(saved: dict, now: dict, seeded_data: bool = False) -> tuple[list[str], list[str]]:
    """(refusals, warnings): one sentence per option that differs between a checkpoint's
    config (`saved`, as in its config.yaml) and this run's (`now`, `Config.to_dict()`).
    `seeded_data`: train.seed drew the data's split and batches (the config's SEEDED_DATA)."""
    old, new = _flat(saved or {}), _flat(now)
    refusals, warnings = [], []
    random_model = new.get("model.random_init") and old.get("model.random_init")
    for key, value in new.items():
        if key not in old or key in SILENT or old[key] == value:
            continue
        if key == "model.tokenizer_name_or_path" and old[key] and value and _same_run_tokenizer(old[key], value):
            continue
        before = old[key]
        change = f"{key}: {before!r} in the checkpoint, {value!r} now"
        if key in REFUSED or (key == "train.seed" and (random_model or seeded_data)):
            why = REFUSED.get(key) or (
                "the random model was built from it"
                if random_model
                else "the held-out split and the batches were drawn from it"
            )
            refusals.append(f"{change}; {why}; resume with {before!r} or start a new run")
        elif key == "model.name_or_path":
            same = _same_model(before, value)
            if same is False:
                refusals.append(
                    f"{change}; the checkpoint's weights were trained on that model; resume with "
                    f"{before!r} or start a new run"
                )
            else:
                warnings.append(
                    f"{change} ({'the same config.json' if same else 'the checkpoint’s folder is gone'}: "
                    "it must be the same model)"
                )
        elif key in AT_START_ONLY:
            warnings.append(f"{change} (changes nothing on resume: {AT_START_ONLY[key]})")
        else:
            warnings.append(change)
    return refusals, warnings


def resume_changes(config_file: Path, config) -> tuple[list[str], list[str]]:
    """resume_differences between a checkpoint's config.yaml and this run's `config`; none when
    the file is missing or does not parse (a checkpoint written by hand, or damaged only there)."""
    import yaml

    try:
        saved = yaml.safe_load(Path(config_file).read_text())
    except (OSError, yaml.YAMLError):
        return [], []
    return resume_differences(saved, config.to_dict(), config.SEEDED_DATA) if isinstance(saved, dict) else ([], [])
