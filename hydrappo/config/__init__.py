"""Every option of hydrappo: dataclasses with help text (options.py, stage_options.py, agent.py; sections.py
puts them together per command), read from YAML with
command-line overrides (parse.py) and checked as a whole before anything loads (checks.py)."""

from .checks import Problems, is_device_name, validate
from .parse import config_parser, parse_config
from .paths import (
    besides_run_tokenizer,
    check_reward_fn,
    input_paths,
    looks_like_a_path,
    names_run_tokenizer,
    run_tokenizer_path,
    startup_inputs,
    writable_folder_problem,
)
from .options import (
    DTYPE_NAMES,
    ConfigError,
    DataArgs,
    GenerationArgs,
    LoraArgs,
    ModelConfig,
    PPOArgs,
    RewardArgs,
    RunArgs,
    TrainArgs,
    canonical_dtype,
    resolve_path,
    torch_dtype,
)
from .sections import REWARD_SECTIONS, SECTIONS, SFT_SECTIONS, Config, RewardConfig, SFTConfig, sections_of
from .stage_options import PreferenceDataArgs, RewardTrainArgs, SFTDataArgs, SFTTrainArgs, StageTrainArgs
from .values import KL_PENALTIES, LORA_LAYERS, LR_SCHEDULERS, MIXED_PRECISIONS, OPTIMIZERS, Range

__all__ = [
    "Problems",
    "check_reward_fn",
    "input_paths",
    "besides_run_tokenizer",
    "names_run_tokenizer",
    "run_tokenizer_path",
    "startup_inputs",
    "is_device_name",
    "looks_like_a_path",
    "writable_folder_problem",
    "DTYPE_NAMES",
    "Range",
    "KL_PENALTIES",
    "LORA_LAYERS",
    "LR_SCHEDULERS",
    "MIXED_PRECISIONS",
    "OPTIMIZERS",
    "REWARD_SECTIONS",
    "SECTIONS",
    "SFT_SECTIONS",
    "Config",
    "ConfigError",
    "DataArgs",
    "GenerationArgs",
    "LoraArgs",
    "ModelConfig",
    "PPOArgs",
    "PreferenceDataArgs",
    "RewardArgs",
    "RewardConfig",
    "RewardTrainArgs",
    "RunArgs",
    "SFTConfig",
    "SFTDataArgs",
    "SFTTrainArgs",
    "StageTrainArgs",
    "TrainArgs",
    "canonical_dtype",
    "config_parser",
    "parse_config",
    "resolve_path",
    "sections_of",
    "torch_dtype",
    "validate",
]
