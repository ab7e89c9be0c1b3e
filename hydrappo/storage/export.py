"""A hydrappo checkpoint -> a plain transformers model directory, or its LoRA adapter as a peft folder.

    hydrappo export CHECKPOINT --out DIR [--value-head FILE] [--max-shard-size 2GB] [--keep-adapter]

A checkpoint (output_dir/checkpoint-<step>, or output_dir for the newest) becomes a model
directory (config, tokenizer, safetensors weights) holding the trained policy, which loads
with AutoModelForCausalLM.from_pretrained alone. The base model is rebuilt from the model
section of the checkpoint's config.yaml exactly as training built it (storage/models.py
build_hydra; `random_init` models are re-created from train.seed), the trainable weights
are loaded into it, LoRA adapters are merged, and the policy (`hydra.model`) is saved with
`save_pretrained`. A run that trained on a quantized trunk (model.trunk_quantization) is
exported in full precision: its frozen bottom is re-read from the original weights, so the
exported model's logits differ from the training policy's by the quantization's drift
(README, "A quantized trunk"). A trained lm_head that was tied to the input embeddings is exported
untied (config.tie_word_embeddings = false). With `keep_adapter` (--keep-adapter) a LoRA run's
adapter is written as it trained instead, unmerged: a peft adapter folder (adapter_config.json,
adapter_model.safetensors, the tokenizer) that `PeftModel.from_pretrained(base, folder)` puts on
the base model. The output is written to a temporary sibling folder and renamed when complete
(storage/atomic.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..config import Config, ConfigError
from ..errors import UsageError, plain_write_errors
from ..model.lora import merged_model
from .atomic import is_nonempty_dir, write_directory, write_files_into
from .checkpoint import (
    WEIGHTS_NAME,
    CheckpointError,
    find_checkpoint,
    load_checkpoint_config,
    load_trainable_weights,
    read_trainer_state,
    seed_everything,
)
from .models import BUNDLED_MODELS, ModelLoadError, build_hydra, is_hub_id
from .reward_branch import load_reward_branch

EXPORT_INFO_NAME = "hydrappo_export.json"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class ExportError(UsageError):
    """A conversion cannot be done as asked; the message says what to change."""


# --------------------------------------------------------------------------- shared helpers


def parse_shard_size(size: str | int) -> int:
    """Bytes of a --max-shard-size such as 5GB, 500MB or 2GiB (transformers' own reading)."""
    from transformers.utils.hub import convert_file_size_to_int

    try:
        value = convert_file_size_to_int(size)
    except (ValueError, TypeError):
        value = None
    if not isinstance(value, int) or value <= 0:
        raise ExportError(
            f"--max-shard-size={size!r}: not a size. Write a positive whole number and a unit, e.g. 5GB, 500MB or 2GiB."
        )
    return value


def check_output_dir(out: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse a non-empty output directory (or a file in its place) unless overwriting."""
    path = Path(out).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ExportError(f"output {str(path)!r} exists and is not a directory.")
    if is_nonempty_dir(path) and not overwrite:
        raise ExportError(f"output directory {str(path)!r} is not empty; choose another or pass --overwrite.")
    return path


def check_output_file(path: str | os.PathLike | None, overwrite: bool) -> Path | None:
    if path is None:
        return None
    path = Path(path).expanduser().absolute()
    if path.exists() and (path.is_dir() or not overwrite):
        raise ExportError(f"{str(path)!r} exists; choose another file or pass --overwrite.")
    return path


def save_pretrained_dir(model, tokenizer, tmp: Path, max_shard_size: str | int) -> None:
    """transformers' own writer: config.json, generation_config.json, safetensors shards
    (with an index when there are several) and the tokenizer files."""
    model.config.name_or_path = ""
    model.save_pretrained(str(tmp), max_shard_size=max_shard_size)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))


def _is_old_weights(path: Path) -> bool:
    return (
        path.suffix in (".safetensors", ".bin")
        or path.name.endswith(".index.json")
        or path.name == "adapter_config.json"
    )


def save_model_dir(model, tokenizer, output_dir: str | Path, extra_files: dict[str, str] | None = None) -> Path:
    """`save_pretrained` of a model (safetensors; a PeftModel writes its adapter) and its
    tokenizer into output_dir, which may also hold logs and checkpoints. The model's marker
    file (config.json, or adapter_config.json for an adapter) is removed first and written
    last, so an interrupted write never looks complete; weights of an older model go."""
    from peft import PeftModel

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)

    last = "adapter_config.json" if isinstance(model, PeftModel) else "config.json"
    return write_files_into(output_dir, fill, last=last, stale=_is_old_weights)


# --------------------------------------------------------------------------- checkpoint -> transformers


def _resolve_location(value: str | None, checkpoint: Path, what: str) -> str | None:
    """A path recorded in a checkpoint's config.yaml. Recent checkpoints record absolute
    paths; older ones the path as written in the config file, relative to that file's folder,
    which is unknown here: try the current directory and the checkpoint's parents."""
    if value is None or Path(value).expanduser().exists() or value.lower() in BUNDLED_MODELS:
        return value
    if not Path(value).is_absolute():
        for root in (checkpoint, checkpoint.parent, checkpoint.parent.parent):
            candidate = root / value
            if candidate.exists():
                return str(candidate)
    if is_hub_id(value):
        return value  # resolved in the Hugging Face cache when the model loads
    raise ExportError(
        f"{what} {value!r} recorded in {checkpoint / 'config.yaml'} does not exist (relative paths were resolved against "
        f"the training config file's folder). Pass --base-model PATH{' and --tokenizer PATH' if 'tokenizer' in what else ''}."
    )


def checkpoint_dtype(checkpoint: Path) -> torch.dtype | None:
    """The dtype the trunk was trained in: that of the checkpoint's model weights."""
    from safetensors import safe_open

    names = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    with safe_open(str(checkpoint / WEIGHTS_NAME), "pt") as handle:
        for key in handle.keys():
            if key.startswith("model.") and "lora_" not in key:
                return names.get(handle.get_slice(key).get_dtype())
    return None


def load_checkpoint_hydra(
    checkpoint: str | os.PathLike,
    *,
    base_model: str | None = None,
    tokenizer: str | None = None,
    dtype: torch.dtype | None = None,
    device: str = "cpu",
    trunk_quantization: str | None = None,
):
    """Rebuild a checkpoint's HydraModel with its trained weights. Returns (hydra, tokenizer, config).
    `dtype` (default: the dtype of the checkpoint's weights, i.e. training's) is the dtype
    the base model is loaded in; float16 loads as float32 on the CPU. `trunk_quantization`
    (default: as trained) "none" rebuilds a quantized run's trunk from the original weights."""
    checkpoint = find_checkpoint(checkpoint)
    config = load_checkpoint_config(checkpoint, Config)
    model = config.model
    if base_model is not None:
        model.name_or_path, model.gguf_file = base_model, None
    else:
        model.name_or_path = _resolve_location(model.name_or_path, checkpoint, "the base model")
    if tokenizer is not None:
        model.tokenizer_name_or_path = tokenizer
    else:
        model.tokenizer_name_or_path = _resolve_location(model.tokenizer_name_or_path, checkpoint, "the tokenizer")
    config.lora.lora_init_adapter = _resolve_location(config.lora.lora_init_adapter, checkpoint, "lora_init_adapter")
    trained_quantization = model.trunk_quantization
    if trunk_quantization is not None:
        model.trunk_quantization = trunk_quantization

    wanted = dtype or checkpoint_dtype(checkpoint)
    if wanted is not None:
        # Rebuild in the dtype training used: random-init weights and rounding depend on it.
        cpu_half = wanted == torch.float16 and torch.device(device).type == "cpu"
        model.dtype = "float32" if cpu_half else dtype_name(wanted)
    seed_everything(config.train.seed)
    try:
        hydra, tok = build_hydra(model, config.lora, device=torch.device(device), value_head=config.ppo.uses_critic)
        load_trainable_weights(hydra, checkpoint)
        model.trunk_quantization = trained_quantization  # the config says how the run trained
    except CheckpointError as error:
        raise ExportError(str(error)) from error
    except (ConfigError, OSError) as error:
        hint = " If the base model moved, pass --base-model PATH." if isinstance(error, ModelLoadError) else ""
        raise ExportError(f"cannot rebuild the model of {checkpoint}: {error}{hint}") from error
    return hydra, tok, config


def policy_model(hydra):
    """The trained policy as a plain transformers model (LoRA adapters merged)."""
    if getattr(hydra, "uses_lora", False):
        return merged_model(hydra)
    return hydra.model


def check_keep_adapter(checkpoint: Path) -> None:
    """--keep-adapter's refusals, read from the checkpoint's config.yaml before anything is built or written."""
    lora = load_checkpoint_config(checkpoint, Config).lora
    if lora.lora_r <= 0:
        raise ExportError(
            f"--keep-adapter: {checkpoint} was trained without LoRA (lora.lora_r: 0), so it has no adapter to keep; "
            "leave out --keep-adapter to export the trained policy as a model."
        )
    if lora.lora_init_adapter:
        raise ExportError(
            f"--keep-adapter: {checkpoint} trained its adapter on the base with lora.lora_init_adapter "
            f"{lora.lora_init_adapter!r} merged into it, so the adapter alone does not fit the base model; "
            "leave out --keep-adapter to export the policy merged."
        )


def save_adapter_dir(hydra, tokenizer, tmp: Path, base_model: str | None, dtype: torch.dtype | None) -> None:
    """The LoRA adapter as peft writes it (adapter_config.json naming `base_model`, adapter_model.safetensors),
    in `dtype` when given, and the tokenizer."""
    peft_model = hydra.peft_model
    if dtype is not None:
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.data = param.data.to(dtype)
    for adapter in peft_model.peft_config.values():
        adapter.base_model_name_or_path = base_model
    peft_model.save_pretrained(str(tmp), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))


def save_value_head(hydra, path: Path) -> None:
    """The value head alone: keys of hydrappo.heads.ValueHead (mlp.0.weight, ...), float32."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in hydra.value_head.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        state,
        str(path),
        metadata={"format": "pt", "hydrappo": "value_head", "hidden_size": str(hydra.arch.hidden_size)},
    )


def reward_branch_location(config, checkpoint: Path) -> str:
    """Where the reward branch a run used (model.reward_branch_path) is now, as its checkpoint records it."""
    if not config.model.reward_branch_path:
        raise ExportError(f"{checkpoint} was trained without a reward branch (model.reward_branch_path is empty).")
    return _resolve_location(config.model.reward_branch_path, Path(checkpoint), "the reward branch")


def save_reward_branch(hydra, config, checkpoint: Path, path: Path) -> None:
    """The reward branch the run used (model.reward_branch_path): its top layers, norm and head."""
    from safetensors.torch import save_file

    branch_path = reward_branch_location(config, checkpoint)
    try:
        branch = load_reward_branch(hydra, branch_path)
    except CheckpointError as error:
        raise ExportError(str(error)) from error
    state = {k: v.detach().cpu().contiguous() for k, v in branch.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata={"format": "pt", "hydrappo": "reward_branch", "source": str(branch_path)})


def export_checkpoint(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    *,
    base_model: str | None = None,
    tokenizer: str | None = None,
    dtype: torch.dtype | None = None,
    max_shard_size: str | int = "5GB",
    value_head: str | os.PathLike | None = None,
    reward_branch: str | os.PathLike | None = None,
    overwrite: bool = False,
    device: str = "cpu",
    keep_adapter: bool = False,
) -> Path:
    """Write the trained policy of `checkpoint` as a transformers model directory `out`, or with
    `keep_adapter` a LoRA run's adapter as a peft adapter folder `out` (for the base model it trained on).
    `dtype` casts the written weights (default: the dtype training used)."""
    out = check_output_dir(out, overwrite)
    value_head = check_output_file(value_head, overwrite)
    reward_branch = check_output_file(reward_branch, overwrite)
    checkpoint = find_checkpoint(checkpoint)
    if keep_adapter:
        check_keep_adapter(checkpoint)
    # A quantized trunk is rebuilt from the original weights: the policy is written in full precision.
    hydra, tok, config = load_checkpoint_hydra(
        checkpoint, base_model=base_model, tokenizer=tokenizer, device=device, trunk_quantization="none"
    )
    if value_head is not None and hydra.value_head is None:
        raise ExportError(
            f"--value-head: {checkpoint} was trained with ppo.advantage_estimator="
            f"{config.ppo.advantage_estimator!r}, which has no value head; leave out --value-head."
        )
    model = None if keep_adapter else policy_model(hydra)
    out_dtype = dtype or checkpoint_dtype(checkpoint)
    if model is not None and out_dtype is not None and next(model.parameters()).dtype != out_dtype:
        model.to(out_dtype)
    trainer_state = read_trainer_state(checkpoint)
    info = {
        "source": str(checkpoint.resolve()),
        "step": trainer_state.get("step"),
        "base_model": config.model.name_or_path,
        "num_layers_unfrozen": hydra.num_layers_unfrozen,
        "trainable_layers": config.model.trainable_layers,
        "train_lm_head": hydra.train_lm_head,
        "train_final_norm": hydra.train_final_norm,
        "lora": bool(getattr(hydra, "uses_lora", False)),
        "trained_trunk_quantization": config.model.trunk_quantization,
    }
    if keep_adapter:
        info.update(adapter=True, base_model_gguf_file=config.model.gguf_file)

    def fill(tmp: Path) -> None:
        if keep_adapter:
            save_adapter_dir(hydra, tok, tmp, config.model.name_or_path, dtype)
        else:
            save_pretrained_dir(model, tok, tmp, max_shard_size)
        (tmp / EXPORT_INFO_NAME).write_text(json.dumps(info, indent=2) + "\n")

    with plain_write_errors(
        "the exported model", out, f"nothing was replaced and the checkpoint {checkpoint} is intact", "and export again"
    ):
        write_directory(out, fill, replace=overwrite)
    if value_head is not None:
        save_value_head(hydra, value_head)
    if reward_branch is not None:
        save_reward_branch(hydra, config, checkpoint, reward_branch)
    return out
