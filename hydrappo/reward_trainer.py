"""Reward model training on the hydra trunk: pairwise (Bradley–Terry) preferences.

    hydrappo reward CONFIG.yaml [--option value ...]

The reward model is a *branch* of the same trunk PPO uses: a trainable copy of the
ORIGINAL top N decoder layers, its own copy of the final norm and a scalar head read
at the last non-padding token. The bottom L - N layers are frozen, so they run without
gradients (once per example with `train.cache_split_hidden`), and only the branch
trains. The chosen and the rejected response of a pair go through in one batch.

Loss (Ouyang et al. 2022; Stiennon et al. 2020): -log sigmoid(r_chosen - r_rejected - m),
with an optional per-pair margin m (Touvron et al. 2023).

After training, the branch's mean and std score on a reference set are stored with the
checkpoint, so PPO can normalise scores to mean 0 / std 1 under the initial policy
(`reward.score_normalization: ref`; Ziegler et al. 2019, Huang et al. 2024).

A reward checkpoint is `output_dir/checkpoint-<step>/` (written atomically by
checkpoint.py): `trainable.safetensors` holds the branch (layers.*, norm.*, head.*),
`trainer_state.json` the base model's identity, the score statistics and the final
evaluation. `load_reward_branch(hydra, path)` puts it into a HydraModel's reward slot;
`path` may also be the output_dir (its latest checkpoint is used).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import load_file

from . import checkpoint as ckpt
from .config import REWARD_SECTIONS, ConfigError, GenerationArgs, ModelConfig, RewardConfig, parse_config, validate_stage
from .data import BUILDERS, DataError, tokenize_prompts
from .hydra import HydraModel, RewardBranch
from .rollout import generate_responses, pack_sequences

logger = logging.getLogger("hydrappo")

REWARD_KIND = "hydrappo-reward-branch"
REWARD_FORMAT_VERSION = 1
# Relative difference of the frozen trunk's weight statistics above which a reward branch
# is taken to sit on another trunk. bf16 vs float32 copies of one model differ far less.
FINGERPRINT_RTOL = 1e-3


# --------------------------------------------------------------------------- pure math
def preference_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict]:
    """Bradley–Terry loss of (B,) scores: mean of -log sigmoid(r_c - r_r - margin).

    Stats: `accuracy` (a tie counts half), `margin` (mean r_c - r_r), mean chosen and
    rejected scores. logsigmoid is used, not log(sigmoid), so large gaps stay finite."""
    chosen, rejected = chosen.float(), rejected.float()
    gap = chosen - rejected
    target_gap = gap - margin.to(gap) if margin is not None else gap
    loss = -F.logsigmoid(target_gap).mean()
    with torch.no_grad():
        accuracy = ((gap > 0).float() + 0.5 * (gap == 0).float()).mean()
        stats = {
            "loss": loss.detach(),
            "accuracy": accuracy,
            "margin": gap.mean(),
            "chosen_score": chosen.mean(),
            "rejected_score": rejected.mean(),
        }
    return loss, stats


def score_statistics(scores: torch.Tensor) -> tuple[float, float]:
    """(mean, std) of a set of scores; the std is the unbiased one and must be positive."""
    scores = scores.double().flatten()
    if scores.numel() < 2:
        raise ValueError(f"score statistics need at least 2 scores, got {scores.numel()}.")
    mean, std = scores.mean().item(), scores.std().item()
    if not (math.isfinite(mean) and math.isfinite(std)) or std <= 0:
        raise ValueError(f"degenerate reward scores on the reference set (mean {mean}, std {std}).")
    return mean, std


# --------------------------------------------------------------------------- table data
def _data_files(path: Path, setting: str) -> list[Path]:
    if not path.exists():
        raise DataError(f"{setting}: {str(path)!r} does not exist.")
    if path.is_file():
        if path.suffix.lower() not in BUILDERS or BUILDERS[path.suffix.lower()] == "text":
            raise DataError(f"{setting}: {path} is not a .jsonl/.json/.csv/.parquet file.")
        return [path]
    # Sorted, so the row order (and hence the eval split and data order) is stable.
    files = sorted(
        f for f in path.rglob("*")
        if f.is_file() and BUILDERS.get(f.suffix.lower(), "text") != "text"
        and not any(p.startswith(".") for p in f.relative_to(path).parts)
    )
    if not files:
        raise DataError(f"{setting}: directory {str(path)!r} holds no .jsonl/.json/.csv/.parquet files.")
    return files


def load_table(path: str | Path, columns: list[str], optional: list[str] = (), setting: str = "data.train_file") -> dict:
    """Columns of a jsonl/json/csv/parquet file (or of all such files in a directory) read
    with `datasets`: {column: list}. `columns` must hold non-empty-able strings; an
    `optional` column missing from the file maps to None."""
    from datasets import load_dataset

    table = {name: [] for name in (*columns, *optional)}
    for file in _data_files(Path(path), setting):
        builder = BUILDERS[file.suffix.lower()]
        try:
            dataset = load_dataset(builder, data_files=str(file), split="train")
        except Exception as error:  # datasets raises many types for malformed files
            raise DataError(f"{file}: could not be read as {builder}: {error}") from error
        missing = [c for c in columns if c not in dataset.column_names]
        if missing:
            raise DataError(
                f"{file}: no column {', '.join(map(repr, missing))}; columns present: "
                f"{', '.join(dataset.column_names) or '(none)'}. Set the data.*_column options to the right names."
            )
        for name in columns:
            values = list(dataset[name])
            for row, value in enumerate(values):
                if not isinstance(value, str):
                    raise DataError(f"{file}: row {row + 1}: column {name!r} holds {type(value).__name__} {value!r}, not text.")
            table[name].extend(values)
        for name in optional:
            if table[name] is None:
                continue
            if name in dataset.column_names:
                table[name].extend(dataset[name])
            else:
                table[name] = None
    if not table[columns[0]]:
        raise DataError(f"{setting}: {str(path)!r} holds no rows.")
    return table


def split_by_prompt(prompts: list[str], eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Row indices (train, eval): a seeded `eval_fraction` of the distinct prompts, with
    all their rows, is held out, so no held-out prompt is seen in training."""
    unique = sorted(set(prompts))
    if eval_fraction <= 0 or len(unique) < 2:
        return list(range(len(prompts))), []
    order = np.random.default_rng(seed).permutation(len(unique))
    held = {unique[i] for i in order[: max(1, round(eval_fraction * len(unique)))]}
    train = [i for i, p in enumerate(prompts) if p not in held]
    held_rows = [i for i, p in enumerate(prompts) if p in held]
    return train, held_rows


def tokenize_responses(texts: list[str], tokenizer, max_length: int, append_eos: bool, add_special_tokens: bool = False):
    """Token ids of each response, cut to `max_length`. With `append_eos` a response ends
    with EOS as a finished PPO response does, unless it was cut (a cut response did not end)."""
    encoded = tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"] if texts else []
    eos = [tokenizer.eos_token_id] if append_eos else []
    if append_eos and tokenizer.eos_token_id is None:
        raise DataError("append_eos is set but the tokenizer has no EOS token; set data.append_eos: false.")
    return [(list(ids) + eos)[:max_length] for ids in encoded]


def encode_prompts(texts: list[str], tokenizer, data) -> list[list[int]]:
    return tokenize_prompts(texts, tokenizer, data.max_prompt_length, data.apply_chat_template, data.system_prompt).input_ids


@dataclass
class PreferencePairs:
    """Tokenized preference pairs; `prompts` are the raw texts (for the eval split)."""

    prompts: list[str]
    prompt_ids: list[list[int]]
    chosen_ids: list[list[int]]
    rejected_ids: list[list[int]]
    margins: list[float] | None = None

    def __len__(self) -> int:
        return len(self.chosen_ids)

    def subset(self, index: list[int]) -> "PreferencePairs":
        pick = lambda values: [values[i] for i in index]  # noqa: E731
        return PreferencePairs(
            pick(self.prompts), pick(self.prompt_ids), pick(self.chosen_ids), pick(self.rejected_ids),
            pick(self.margins) if self.margins is not None else None,
        )


def load_preference_pairs(path: str | Path, tokenizer, data, setting: str = "data.train_file") -> PreferencePairs:
    """Read and tokenize (prompt, chosen, rejected[, margin]) rows, as `PreferenceDataArgs` says."""
    columns = ([data.prompt_column] if data.prompt_column else []) + [data.chosen_column, data.rejected_column]
    table = load_table(path, columns, [data.margin_column] if data.margin_column else [], setting)
    chosen, rejected = table[data.chosen_column], table[data.rejected_column]
    if data.prompt_column:
        prompts = table[data.prompt_column]
        prompt_ids = encode_prompts(prompts, tokenizer, data)
        special = False
    else:
        # Whole texts in chosen/rejected: they are tokenized like a prompt (with BOS etc.).
        prompts, prompt_ids, special = [""] * len(chosen), [[] for _ in chosen], True
    margins = None
    if data.margin_column:
        if table[data.margin_column] is None:
            raise DataError(f"{path}: no margin column {data.margin_column!r}; unset data.margin_column or add it.")
        try:
            margins = [float(m) for m in table[data.margin_column]]
        except (TypeError, ValueError) as error:
            raise DataError(f"{path}: margin column {data.margin_column!r} holds a value that is not a number ({error}).") from None
        if not all(math.isfinite(m) for m in margins):
            raise DataError(f"{path}: margin column {data.margin_column!r} holds non-finite values.")
    return PreferencePairs(
        prompts=list(prompts),
        prompt_ids=prompt_ids,
        chosen_ids=tokenize_responses(chosen, tokenizer, data.max_response_length, data.append_eos, special),
        rejected_ids=tokenize_responses(rejected, tokenizer, data.max_response_length, data.append_eos, special),
        margins=margins,
    )


# --------------------------------------------------------------------------- frozen-trunk cache
class SplitCache:
    """The frozen bottom layers' output per example, kept for its real tokens only.

    The bottom of the trunk is frozen and the data is fixed, so an example's split hidden
    state never changes: with the cache on, it is computed once and later epochs,
    evaluations and the score statistics run only the top layers. Off, every batch runs
    the bottom (without gradients)."""

    def __init__(self, hydra: HydraModel, enabled: bool):
        self.hydra, self.enabled = hydra, enabled
        self.rows: dict = {}

    def __call__(self, keys: list | None, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Split hidden states (B, T, H) of a batch; `keys` name its rows (None: not cached)."""
        real = attention_mask.bool()
        if keys is None:
            return self.hydra.split_hidden_states(input_ids, attention_mask)
        if self.enabled and all(key in self.rows for key in keys):
            first = self.rows[keys[0]]
            split = first.new_zeros((*input_ids.shape, first.shape[-1]))
            split[real] = torch.cat([self.rows[key] for key in keys])
            return split
        split = self.hydra.split_hidden_states(input_ids, attention_mask)
        if self.enabled:
            for row, key in enumerate(keys):
                self.rows[key] = split[row][real[row]].clone()
        return split


# --------------------------------------------------------------------------- checkpoints
def trunk_fingerprint(hydra: HydraModel) -> dict[str, float]:
    """Sum of |w| of every frozen parameter below the split (embeddings, bottom layers):
    what a reward branch sees of the trunk. Tolerant to dtype, exact enough to tell models apart."""
    top = {id(p) for p in hydra.arch.layers[hydra.split_index :].parameters()}
    if hydra.arch.final_norm is not None:
        top |= {id(p) for p in hydra.arch.final_norm.parameters()}
    return {
        name: param.detach().abs().sum(dtype=torch.float64).item()
        for name, param in hydra.arch.decoder.named_parameters()
        if id(param) not in top
    }


def base_model_identity(hydra: HydraModel, name_or_path: str | None = None) -> dict:
    config = hydra.config.get_text_config() if hasattr(hydra.config, "get_text_config") else hydra.config
    return {
        "name_or_path": name_or_path,
        "model_name_or_path": getattr(hydra.model, "name_or_path", None),
        "model_type": getattr(config, "model_type", None),
        "num_layers": hydra.arch.num_layers,
        "hidden_size": hydra.arch.hidden_size,
        "vocab_size": hydra.model.get_input_embeddings().weight.shape[0],
        "num_layers_unfrozen": hydra.num_layers_unfrozen,
        "trunk_fingerprint": trunk_fingerprint(hydra),
    }


def new_trainable_branch(hydra: HydraModel) -> RewardBranch:
    """A trainable reward branch: copies of the ORIGINAL top layers and final norm, a fresh head.

    The branch always gets its own norm: with the model's shared final norm, a PPO run
    that trains the final norm (model.train_final_norm) would change the reward model too."""
    branch = hydra.new_reward_branch(trainable=True)
    if branch.norm is None and hydra.arch.final_norm is not None:
        branch.norm = copy.deepcopy(hydra.arch.final_norm).requires_grad_(True)
    return branch


def branch_weights(branch: RewardBranch) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().contiguous() for name, p in branch.named_parameters()}


def reward_checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint folder of `path`: the folder itself, or the latest checkpoint in an output_dir."""
    path = Path(path)
    if not path.exists():
        raise ckpt.CheckpointError(f"reward checkpoint {str(path)!r} does not exist (model.reward_branch_path).")
    if path.is_file():
        path = path.parent
    if not (path / ckpt.TRAINER_STATE_NAME).is_file():
        latest = ckpt.latest_checkpoint(path)
        if latest is None:
            raise ckpt.CheckpointError(
                f"{path} is not a hydrappo reward checkpoint: it has no {ckpt.TRAINER_STATE_NAME} and no checkpoint-<step> "
                "folders. Point model.reward_branch_path at the output_dir of `hydrappo reward` or a checkpoint in it."
            )
        path = latest
    return path


def read_reward_info(path: str | Path) -> tuple[Path, dict]:
    """(checkpoint folder, its reward metadata); errors if it is not a reward checkpoint."""
    folder = reward_checkpoint_dir(path)
    info = json.loads((folder / ckpt.TRAINER_STATE_NAME).read_text())
    if info.get("kind") != REWARD_KIND:
        raise ckpt.CheckpointError(
            f"{folder} is not a reward checkpoint (it looks like a PPO checkpoint or another kind). "
            "Train a reward branch with `hydrappo reward CONFIG.yaml` and point model.reward_branch_path at its output."
        )
    if info.get("format_version", 0) > REWARD_FORMAT_VERSION:
        raise ckpt.CheckpointError(f"{folder} was written by a newer hydrappo (format {info['format_version']}); upgrade.")
    if not (folder / ckpt.WEIGHTS_NAME).is_file():
        raise ckpt.CheckpointError(f"{folder} is incomplete: {ckpt.WEIGHTS_NAME} is missing.")
    return folder, info


def check_base_model(hydra: HydraModel, base: dict, source: str) -> None:
    """Errors when a reward branch cannot sit on this trunk; info/warning when it was
    trained on a model of another name that has the same frozen bottom (e.g. an SFT model)."""
    if hydra.full_model:
        raise ckpt.CheckpointError(
            "a reward branch needs a frozen trunk: with num_layers_unfrozen=-1 (the whole model trains) there is none."
        )
    here = base_model_identity(hydra)
    for key, what in (("hidden_size", "hidden size"), ("num_layers", "number of decoder layers"),
                      ("vocab_size", "vocabulary size"), ("model_type", "model type")):
        if base.get(key) is not None and base[key] != here[key]:
            raise ckpt.CheckpointError(
                f"{source} was trained on another base model: its {what} is {base[key]}, this model's is {here[key]} "
                f"(reward branch trained on {base.get('name_or_path')!r}). Train the reward branch on the PPO base model."
            )
    if base["num_layers_unfrozen"] != here["num_layers_unfrozen"]:
        raise ckpt.CheckpointError(
            f"{source} has {base['num_layers_unfrozen']} reward layers but this hydra splits the trunk at "
            f"{here['num_layers_unfrozen']} top layers: set model.num_layers_unfrozen: {base['num_layers_unfrozen']} "
            "or train the reward branch with the same num_layers_unfrozen as PPO."
        )
    theirs, ours = base.get("trunk_fingerprint") or {}, here["trunk_fingerprint"]
    differing = [
        name for name in ours
        if name not in theirs or abs(theirs[name] - ours[name]) > FINGERPRINT_RTOL * max(abs(ours[name]), 1e-12)
    ]
    if theirs and (differing or set(theirs) != set(ours)):
        raise ckpt.CheckpointError(
            f"{source} was trained on a trunk whose frozen bottom differs from this model's "
            f"({len(differing)} of {len(ours)} parameters differ, e.g. {differing[:2]}): reward branch base "
            f"{base.get('name_or_path')!r}, PPO base {hydra.model.name_or_path!r}. Its scores would be meaningless here; "
            "train the reward branch on the PPO base model (an SFT model that trained only the top layers keeps the bottom)."
        )
    if base.get("model_name_or_path") and base["model_name_or_path"] != here["model_name_or_path"]:
        logger.warning(
            "reward branch %s was trained on %r, PPO uses %r: the frozen bottom layers are identical, so it fits.",
            source, base.get("name_or_path") or base["model_name_or_path"], here["model_name_or_path"],
        )


def load_reward_branch(hydra: HydraModel, path: str | Path) -> RewardBranch:
    """A `hydrappo reward` checkpoint as a RewardBranch for `hydra.attach_reward_branch`.

    `path` is a checkpoint folder or the reward run's output_dir (latest checkpoint).
    Raises CheckpointError when the checkpoint is not a reward checkpoint or was trained
    on another base model (hidden size, layers, N, or a different frozen bottom). The
    checkpoint's metadata, including the score statistics, is `branch.checkpoint_info`."""
    folder, info = read_reward_info(path)
    check_base_model(hydra, info["base_model"], str(folder))
    branch = new_trainable_branch(hydra)
    if not info.get("has_norm", True):  # trained on a model without a final norm
        branch.norm = None
    state = load_file(str(folder / ckpt.WEIGHTS_NAME), device=str(hydra.device))
    params = dict(branch.named_parameters())
    missing, unexpected = sorted(params.keys() - state.keys()), sorted(state.keys() - params.keys())
    if missing or unexpected:
        raise ckpt.CheckpointError(
            f"{folder / ckpt.WEIGHTS_NAME} does not fit this model's reward branch: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}. Was it trained on another architecture?"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            if params[name].shape != tensor.shape:
                raise ckpt.CheckpointError(
                    f"{folder}: reward weight {name} has shape {tuple(tensor.shape)}, this model needs {tuple(params[name].shape)}."
                )
            params[name].copy_(tensor)
    branch.requires_grad_(False)
    branch.checkpoint_info = {k: v for k, v in info.items() if k != "base_model"} | {"path": str(folder)}
    return branch


def apply_reference_stats(reward_args, branch: RewardBranch) -> None:
    """With `reward.score_normalization: ref` and the reward branch as the reward source,
    fill reward.score_ref_mean / score_ref_std that the config leaves unset from the
    reward checkpoint (explicit values win), so that the run's saved config holds them."""
    if reward_args.score_normalization != "ref" or not reward_args.use_reward_branch:
        return
    if reward_args.score_ref_mean is not None and reward_args.score_ref_std is not None:
        return
    info = getattr(branch, "checkpoint_info", {}) or {}
    mean, std = info.get("score_mean"), info.get("score_std")
    if mean is None or std is None:
        raise ckpt.CheckpointError(
            f"reward.score_normalization is 'ref' but the reward checkpoint {info.get('path', '')} holds no score "
            "statistics (it was saved before training ended). Use the final checkpoint, set reward.score_ref_mean "
            "and reward.score_ref_std, or use score_normalization: running."
        )
    if reward_args.score_ref_mean is None:
        reward_args.score_ref_mean = float(mean)
    if reward_args.score_ref_std is None:
        reward_args.score_ref_std = float(std)
    logger.info(
        "reward scores normalised with the reward checkpoint's reference statistics: mean %.4f, std %.4f",
        reward_args.score_ref_mean, reward_args.score_ref_std,
    )


# --------------------------------------------------------------------------- stage plumbing
def resolve_stage_paths(config, base_dir: Path | None) -> None:
    """Relative paths of a stage config are relative to the config file's folder when
    the file exists there (the PPO trainer's rule), in place."""
    from .trainer import resolve_path

    model, data = config.model, config.data
    model.name_or_path = resolve_path(model.name_or_path, base_dir)
    model.tokenizer_name_or_path = resolve_path(model.tokenizer_name_or_path, base_dir)
    model.reward_branch_path = resolve_path(model.reward_branch_path, base_dir)
    for name in ("train_file", "eval_file", "stats_file"):
        if hasattr(data, name):
            setattr(data, name, resolve_path(getattr(data, name), base_dir))


def setup_stage(config, config_dir, hydra=None, tokenizer=None, **hydra_kwargs):
    """Seed, device, accelerator, and the hydra (built from config.model unless given),
    in the order PPOTrainer uses, so a random-init model gets the same weights as in PPO."""
    from accelerate import Accelerator

    from .models import load_model_and_tokenizer, resolve_dtype
    from .trainer import pick_device, pick_mixed_precision, seed_everything

    train = config.train
    seed_everything(train.seed)
    device = pick_device(train.device)
    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision=pick_mixed_precision(train.mixed_precision, device))
    resolve_stage_paths(config, Path(config_dir) if config_dir is not None else None)
    if hydra is None:
        model_config = config.model
        model, tokenizer = load_model_and_tokenizer(
            model_config, device=accelerator.device, dtype=resolve_dtype(model_config.dtype, accelerator.device)
        )
        hydra = HydraModel(model, model_config.num_layers_unfrozen, layers_path=model_config.layers_path, **hydra_kwargs)
    if tokenizer is None:
        raise ValueError("pass the tokenizer together with a hydra model.")
    return accelerator, hydra, tokenizer


def make_optimizer(params, train, total_steps: int):
    from transformers import get_scheduler

    if not params:
        raise ConfigError("nothing to train: no trainable parameters (check model.num_layers_unfrozen / train_lm_head).")
    optimizer = torch.optim.AdamW(params, lr=train.learning_rate, weight_decay=train.weight_decay)
    scheduler = get_scheduler(
        {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}[train.lr_scheduler],
        optimizer, num_warmup_steps=train.warmup_steps, num_training_steps=max(1, total_steps),
    )
    return optimizer, scheduler


def batches(num_examples: int, batch_size: int, generator: torch.Generator | None):
    """Index batches of one epoch (shuffled when a generator is given)."""
    order = torch.randperm(num_examples, generator=generator).tolist() if generator is not None else list(range(num_examples))
    return [order[i : i + batch_size] for i in range(0, num_examples, batch_size)]


def total_steps_of(train, num_examples: int) -> int:
    per_epoch = math.ceil(num_examples / train.batch_size)
    return train.max_steps if train.max_steps > 0 else train.epochs * per_epoch


def clip_gradients(accelerator, params, max_norm: float) -> float:
    if max_norm and max_norm > 0:
        return float(accelerator.clip_grad_norm_(params, max_norm))
    grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


def as_float(value) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


class MetricsLog:
    """TensorBoard scalars plus one JSON line per step in output_dir/metrics.jsonl."""

    def __init__(self, output_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        output_dir.mkdir(parents=True, exist_ok=True)
        self.path = output_dir / "metrics.jsonl"
        self.path.write_text("")
        self.writer = SummaryWriter(str(output_dir / "tensorboard"))

    def log(self, step: int, stats: dict) -> dict:
        record = {"step": step, **{key: as_float(value) for key, value in stats.items()}}
        for key, value in record.items():
            if key != "step":
                self.writer.add_scalar(key, value, step)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        return record

    def close(self) -> None:
        self.writer.close()


# --------------------------------------------------------------------------- the trainer
class RewardTrainer:
    """Trains a reward branch on a frozen hydra trunk from preference pairs.

    Build it from a `RewardConfig` (`hydrappo reward` does); pass `hydra`/`tokenizer` to
    use a model you built yourself. `config_dir` anchors relative paths of the config."""

    def __init__(self, config: RewardConfig, *, hydra: HydraModel | None = None, tokenizer=None, config_dir=None):
        validate_stage(config)
        self.config = config
        self.accelerator, self.hydra, self.tokenizer = setup_stage(config, config_dir, hydra, tokenizer)
        self.device = self.accelerator.device
        data, train = config.data, config.train
        hydra = self.hydra
        if hydra.full_model:
            raise ConfigError("reward training needs a frozen trunk: set model.num_layers_unfrozen >= 0 (not -1).")
        # Nothing of the policy, reference or value head trains here; only the branch.
        hydra.requires_grad_(False)
        hydra.eval()
        if config.model.reward_branch_path:
            # Continue training an existing reward branch.
            self.branch = load_reward_branch(hydra, config.model.reward_branch_path).requires_grad_(True)
        else:
            self.branch = new_trainable_branch(hydra)

        pairs = load_preference_pairs(data.train_file, self.tokenizer, data)
        if data.eval_file:
            self.train_pairs = pairs
            self.eval_pairs = load_preference_pairs(data.eval_file, self.tokenizer, data, "data.eval_file")
        else:
            # Without a prompt column every row is its own group.
            groups = pairs.prompts if data.prompt_column else [str(i) for i in range(len(pairs))]
            train_index, eval_index = split_by_prompt(groups, data.eval_fraction, train.seed)
            self.train_pairs, self.eval_pairs = pairs.subset(train_index), pairs.subset(eval_index)
        if not len(self.train_pairs):
            raise DataError("no training pairs left after the eval split; lower data.eval_fraction.")
        logger.info("reward training: %d training pairs, %d held-out pairs", len(self.train_pairs), len(self.eval_pairs))

        self.split_cache = SplitCache(hydra, train.cache_split_hidden)
        self.total_steps = total_steps_of(train, len(self.train_pairs))
        optimizer, scheduler = make_optimizer(list(self.branch.parameters()), train, self.total_steps)
        self.optimizer, self.scheduler = self.accelerator.prepare(optimizer, scheduler)
        self.data_generator = torch.Generator().manual_seed(train.seed)
        self.output_dir = Path(train.output_dir)
        self.step = 0
        self.score_stats: dict | None = None
        self.final_eval: dict = {}

    # ------------------------------------------------------------------ scoring
    def _autocast(self):
        from contextlib import nullcontext

        return self.accelerator.autocast() if self.accelerator.mixed_precision != "no" else nullcontext()

    def _scores(self, keys, prompt_ids, response_ids) -> torch.Tensor:
        input_ids, attention_mask, _, _ = pack_sequences(prompt_ids, response_ids, self.tokenizer.pad_token_id)
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        split = self.split_cache(keys, input_ids, attention_mask)
        with self._autocast():
            return self.hydra.reward_scores(split, input_ids, attention_mask, self.branch).float()

    def _pair_scores(self, pairs: PreferencePairs, index: list[int], tag: str):
        """Chosen and rejected scores of pairs `index`, in ONE batch (2 x len(index) rows)."""
        keys = [(tag, i, 0) for i in index] + [(tag, i, 1) for i in index]
        prompts = [pairs.prompt_ids[i] for i in index]
        responses = [pairs.chosen_ids[i] for i in index] + [pairs.rejected_ids[i] for i in index]
        scores = self._scores(keys, prompts + prompts, responses)
        return scores[: len(index)], scores[len(index) :]

    @torch.no_grad()
    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]], batch_size: int | None = None) -> torch.Tensor:
        """Scores of (prompt, response) token sequences by the branch as it is now (B,), on the CPU."""
        batch_size = batch_size or self.config.train.eval_batch_size
        out = []
        for start in range(0, len(prompt_ids), batch_size):
            stop = start + batch_size
            out.append(self._scores(None, prompt_ids[start:stop], response_ids[start:stop]).cpu())
        return torch.cat(out) if out else torch.zeros(0)

    @torch.no_grad()
    def evaluate(self, pairs: PreferencePairs | None = None, tag: str = "eval") -> dict:
        """Loss, accuracy and mean margin over all of `pairs` (default: the held-out pairs)."""
        pairs = self.eval_pairs if pairs is None else pairs
        if not len(pairs):
            return {}
        chosen, rejected = [], []
        for index in batches(len(pairs), max(1, self.config.train.eval_batch_size // 2), None):
            c, r = self._pair_scores(pairs, index, tag)
            chosen.append(c.cpu())
            rejected.append(r.cpu())
        margins = torch.tensor(pairs.margins) if pairs.margins is not None else None
        _, stats = preference_loss(torch.cat(chosen), torch.cat(rejected), margins)
        return {f"{tag}/{key}": as_float(value) for key, value in stats.items()}

    @torch.no_grad()
    def reference_statistics(self) -> dict:
        """Mean and std of the trained branch's scores on the reference set (see data.stats_file)."""
        data, train = self.config.data, self.config.train
        rng = random.Random(train.seed)
        if data.stats_file is None:
            pairs = self.train_pairs
            candidates = [(i, side) for i in range(len(pairs)) for side in (0, 1)]
            chosen_set = sorted(rng.sample(candidates, min(data.stats_max_samples, len(candidates))))
            scores = []
            for start in range(0, len(chosen_set), train.eval_batch_size):
                part = chosen_set[start : start + train.eval_batch_size]
                keys = [("train", i, side) for i, side in part]
                responses = [(pairs.chosen_ids if side == 0 else pairs.rejected_ids)[i] for i, side in part]
                scores.append(self._scores(keys, [pairs.prompt_ids[i] for i, _ in part], responses).cpu())
            source = f"chosen and rejected responses of {len(chosen_set)} training texts"
        else:
            prompt_column = data.prompt_column or "prompt"
            table = load_table(data.stats_file, [prompt_column], [data.stats_response_column], "data.stats_file")
            index = sorted(rng.sample(range(len(table[prompt_column])), min(data.stats_max_samples, len(table[prompt_column]))))
            prompt_ids = encode_prompts([table[prompt_column][i] for i in index], self.tokenizer, data)
            if table[data.stats_response_column] is not None:
                texts = [str(table[data.stats_response_column][i]) for i in index]
                response_ids = tokenize_responses(texts, self.tokenizer, data.max_response_length, data.append_eos)
                source = f"{len(index)} prompt/response rows of {data.stats_file}"
            else:
                # Responses of the base policy, sampled and stopped as PPO's first rollouts are.
                generation = GenerationArgs(
                    max_new_tokens=data.stats_max_new_tokens, temperature=data.stats_temperature,
                    generation_batch_size=train.eval_batch_size,
                )
                response_ids = generate_responses(self.hydra, self.tokenizer, prompt_ids, generation).response_ids
                source = f"base-policy responses to {len(index)} prompts of {data.stats_file}"
            scores = [self.score(prompt_ids, response_ids)]
        scores = torch.cat(scores)
        mean, std = score_statistics(scores)
        return {"score_mean": mean, "score_std": std, "count": int(scores.numel()), "source": source}

    # ------------------------------------------------------------------ training
    def train_step(self, index: list[int]) -> dict:
        pairs = self.train_pairs
        chosen, rejected = self._pair_scores(pairs, index, "train")
        margins = torch.tensor([pairs.margins[i] for i in index], device=chosen.device) if pairs.margins is not None else None
        loss, stats = preference_loss(chosen, rejected, margins)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite reward loss at step {self.step + 1}; lower train.learning_rate.")
        self.accelerator.backward(loss)
        grad_norm = clip_gradients(self.accelerator, list(self.branch.parameters()), self.config.train.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        stats = {f"train/{key}": value for key, value in stats.items()}
        stats.update({"train/grad_norm": grad_norm, "lr": self.scheduler.get_last_lr()[0]})
        return stats

    def train(self) -> list[dict]:
        """Train, evaluate, compute the reference statistics and write the final checkpoint."""
        from tqdm.auto import tqdm

        train = self.config.train
        log = MetricsLog(self.output_dir)
        history = []
        bar = tqdm(total=self.total_steps, desc="reward", disable=not train.progress_bar, dynamic_ncols=True)
        start = time.perf_counter()
        try:
            done = False
            while not done:
                epoch_batches = batches(len(self.train_pairs), train.batch_size, self.data_generator)
                for batch_number, index in enumerate(epoch_batches):
                    stats = self.train_step(index)
                    end_of_epoch = batch_number == len(epoch_batches) - 1
                    done = self.step >= self.total_steps
                    if (train.eval_every and self.step % train.eval_every == 0) or end_of_epoch or done:
                        stats.update(self.evaluate())
                    history.append(log.log(self.step, stats))
                    bar.update(1)
                    bar.set_postfix(loss=f"{as_float(stats['train/loss']):.3f}", acc=f"{as_float(stats['train/accuracy']):.2f}")
                    if train.save_every and self.step % train.save_every == 0 and not done:
                        self.save()
                    if done:
                        break
            self.final_eval = {key: value for key, value in history[-1].items() if key.startswith("eval/")}
            self.score_stats = self.reference_statistics()
            log.writer.add_scalar("reference/score_mean", self.score_stats["score_mean"], self.step)
            log.writer.add_scalar("reference/score_std", self.score_stats["score_std"], self.step)
            logger.info(
                "reward scores on the reference set (%s): mean %.4f, std %.4f",
                self.score_stats["source"], self.score_stats["score_mean"], self.score_stats["score_std"],
            )
            self.checkpoint_path = self.save()
        finally:
            bar.close()
            log.close()
        logger.info("reward training took %.1f s", time.perf_counter() - start)
        return history

    def save(self) -> Path:
        """checkpoint-<step> with the branch; the final one also holds the score statistics."""
        stats = self.score_stats or {}
        info = {
            "kind": REWARD_KIND,
            "format_version": REWARD_FORMAT_VERSION,
            "base_model": base_model_identity(self.hydra, self.config.model.name_or_path),
            "has_norm": self.branch.norm is not None,
            "score_mean": stats.get("score_mean"),
            "score_std": stats.get("score_std"),
            "score_stats": {k: stats[k] for k in ("count", "source") if k in stats},
            "eval": self.final_eval if self.score_stats else {},
            "data": {
                "apply_chat_template": self.config.data.apply_chat_template,
                "system_prompt": self.config.data.system_prompt,
                "append_eos": self.config.data.append_eos,
            },
        }
        return ckpt.save_checkpoint(
            self.output_dir, self.step, model=self.branch, training_state={}, trainer_state=info,
            config_yaml=yaml.safe_dump(self.config.to_dict(), sort_keys=False),
            keep_last=self.config.train.keep_last, weights=branch_weights(self.branch),
        )


# --------------------------------------------------------------------------- command line
def reward_command(argv: list[str]) -> int:
    from .cli import config_command_args

    parsed = config_command_args(
        argv, "hydrappo reward",
        "Train a reward branch on preference pairs (prompt, chosen, rejected). Options after the config file "
        "override it, e.g. --learning_rate 1e-4.",
        sections=REWARD_SECTIONS,
    )
    if isinstance(parsed, int):
        return parsed
    args, overrides = parsed
    config = parse_config(args.config, overrides, sections=REWARD_SECTIONS, config_cls=RewardConfig)
    trainer = RewardTrainer(config, config_dir=Path(args.config).resolve().parent)
    try:
        trainer.train()
    except (FloatingPointError, ckpt.CheckpointError) as error:
        print(f"hydrappo reward: {error}", file=sys.stderr)
        return 1
    evaluation = ", ".join(f"{k} {v:.3f}" for k, v in trainer.final_eval.items() if k in ("eval/accuracy", "eval/loss"))
    print(
        f"done: step {trainer.step}{', ' + evaluation if evaluation else ''}; reference scores mean "
        f"{trainer.score_stats['score_mean']:.4f}, std {trainer.score_stats['score_std']:.4f}.\n"
        f"reward checkpoint: {trainer.checkpoint_path}\n"
        f"use it in PPO with model.reward_branch_path: {trainer.output_dir} and reward.use_reward_branch: true "
        f"(model.num_layers_unfrozen: {trainer.hydra.num_layers_unfrozen})"
    )
    return 0
