"""Checks of a whole config before anything is loaded, with messages that say what to change."""

from __future__ import annotations

from ..algo.advantages import ADVANTAGE_ESTIMATORS, GROUP_ESTIMATORS
from ..algo.kl import KL_CONTROLLERS, KL_ESTIMATORS
from ..algo.losses import IMPORTANCE_SAMPLING_LEVELS, LOSS_AGG_MODES
from ..algo.scores import SCORE_NORMALIZATIONS
from ..model.quantize import TRUNK_QUANTIZATIONS
from .sections import (
    KL_PENALTIES, LORA_LAYERS, LR_SCHEDULERS, MIXED_PRECISIONS, OPTIMIZERS, Config, ConfigError, RewardConfig, SFTConfig,
    canonical_dtype,
)


def _check_choices(choices: dict) -> None:
    for name, (value, valid) in choices.items():
        if value not in valid:
            raise ConfigError(f"{name}={value!r} is not one of: {', '.join(valid)}.")


def _check_common(config) -> None:
    model = config.model
    canonical_dtype(model.dtype)
    optimizer = config.ppo.optimizer if isinstance(config, Config) else config.train.optimizer
    _check_choices({
        "train.mixed_precision": (config.train.mixed_precision, MIXED_PRECISIONS),
        "model.trunk_quantization": (model.trunk_quantization, TRUNK_QUANTIZATIONS),
        f"{'ppo' if isinstance(config, Config) else 'train'}.optimizer": (optimizer, OPTIMIZERS),
    })  # fmt: skip
    if not config.train.dist_timeout_s > 0:
        raise ConfigError(f"train.dist_timeout_s={config.train.dist_timeout_s} must be > 0 (seconds, e.g. 1800).")
    lora = getattr(config, "lora", None)
    if model.trunk_quantization != "none":
        if model.num_layers_unfrozen == -1:
            raise ConfigError(
                f"model.trunk_quantization={model.trunk_quantization!r} quantizes the frozen trunk, but "
                "num_layers_unfrozen=-1 trains every layer. Lower num_layers_unfrozen or set trunk_quantization: none."
            )
        if lora is not None and lora.lora_r > 0 and lora.lora_layers == "all":
            raise ConfigError(
                "model.trunk_quantization needs a frozen trunk below the adapters: use lora.lora_layers: top, or "
                "trunk_quantization: none."
            )
        if getattr(config.train, "fsdp_trunk", False):
            raise ConfigError(
                "train.fsdp_trunk shards the frozen trunk and model.trunk_quantization quantizes it: choose one "
                "(each process can hold a whole quantized trunk)."
            )
    if lora is not None:
        _check_choices({"lora.lora_layers": (lora.lora_layers, LORA_LAYERS)})
        if lora.lora_dropout != 0:
            raise ConfigError(
                f"lora.lora_dropout={lora.lora_dropout}: hydrappo runs every model without dropout (PPO's importance "
                "ratio compares one fixed policy with itself, and cached trunk outputs assume deterministic layers). "
                "Set lora_dropout: 0."
            )


def validate(config) -> None:
    """Cross-field checks of any config container, with messages that say what to change."""
    _check_common(config)
    if isinstance(config, Config):
        _validate_ppo(config)
    else:
        _validate_stage(config)


def _validate_ppo(config: Config) -> None:
    ppo, gen, reward = config.ppo, config.generation, config.reward
    if ppo.batch_size % ppo.mini_batch_size:
        raise ConfigError(f"ppo.batch_size ({ppo.batch_size}) must be a multiple of mini_batch_size ({ppo.mini_batch_size}).")
    if ppo.mini_batch_size % ppo.gradient_accumulation_steps:
        raise ConfigError(
            f"ppo.mini_batch_size ({ppo.mini_batch_size}) must be a multiple of gradient_accumulation_steps "
            f"({ppo.gradient_accumulation_steps})."
        )
    _check_choices({
        "ppo.lr_scheduler": (ppo.lr_scheduler, LR_SCHEDULERS),
        "ppo.kl_controller": (ppo.kl_controller, KL_CONTROLLERS),
        "ppo.kl_penalty": (ppo.kl_penalty, KL_PENALTIES),
        "ppo.kl_estimator": (ppo.kl_estimator, KL_ESTIMATORS),
        "ppo.loss_agg_mode": (ppo.loss_agg_mode, LOSS_AGG_MODES),
        "reward.score_normalization": (reward.score_normalization, SCORE_NORMALIZATIONS),
        "ppo.advantage_estimator": (ppo.advantage_estimator, ADVANTAGE_ESTIMATORS),
        "ppo.importance_sampling_level": (ppo.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS),
    })  # fmt: skip
    group = gen.samples_per_prompt
    if group < 1:
        raise ConfigError(f"generation.samples_per_prompt={group} must be at least 1.")
    if ppo.batch_size % group:
        raise ConfigError(
            f"ppo.batch_size ({ppo.batch_size}) counts responses and must be divisible by generation.samples_per_prompt "
            f"({group}): set batch_size to a multiple of {group}."
        )
    if ppo.advantage_estimator in GROUP_ESTIMATORS and group < 2:
        raise ConfigError(
            f"ppo.advantage_estimator={ppo.advantage_estimator!r} compares the responses to one prompt with each other: "
            "set generation.samples_per_prompt >= 2 (e.g. 4 or 8)."
        )
    if ppo.cliprange_high is not None and ppo.cliprange_high <= 0:
        raise ConfigError(f"ppo.cliprange_high={ppo.cliprange_high} must be > 0 (e.g. 0.28), or null for cliprange.")
    if gen.max_new_tokens < 1 or gen.min_new_tokens > gen.max_new_tokens:
        raise ConfigError("generation: need 1 <= max_new_tokens and min_new_tokens <= max_new_tokens.")
    sources = [bool(reward.reward_fn), bool(reward.reward_model), reward.use_reward_branch]
    if sum(sources) != 1:
        raise ConfigError(
            "reward: set exactly one reward source: reward_fn ('module:function' or 'file.py:function'), "
            "reward_model (a sequence-classification model directory) or use_reward_branch: true."
        )
    if reward.use_reward_branch and not config.model.reward_branch_path:
        raise ConfigError("reward.use_reward_branch needs model.reward_branch_path (a `hydrappo reward` checkpoint).")
    if config.data.prompts is None:
        raise ConfigError("data.prompts is required: a jsonl/csv/parquet/txt file or a directory of prompts.")


def _validate_stage(config) -> None:
    data, train = config.data, config.train
    if not data.train_file:
        raise ConfigError("data.train_file is required: a jsonl/json/csv/parquet file or a directory of them.")
    if not 0.0 <= data.eval_fraction < 1.0:
        raise ConfigError(f"data.eval_fraction={data.eval_fraction} must be in [0, 1).")
    if data.max_prompt_length < 1 or data.max_response_length < 1:
        raise ConfigError("data.max_prompt_length and data.max_response_length must be at least 1.")
    if train.batch_size < 1 or train.eval_batch_size < 1:
        raise ConfigError("train.batch_size and train.eval_batch_size must be at least 1.")
    if train.epochs < 1 and train.max_steps < 1:
        raise ConfigError("set train.epochs or train.max_steps to at least 1.")
    _check_choices({"train.lr_scheduler": (train.lr_scheduler, LR_SCHEDULERS)})
    if isinstance(config, RewardConfig) and config.model.train_lm_head:
        raise ConfigError("model.train_lm_head has no use in the reward stage (only the reward branch trains); remove it.")
    if isinstance(config, SFTConfig) and config.model.reward_branch_path:
        raise ConfigError("model.reward_branch_path has no use in sft; remove it.")
