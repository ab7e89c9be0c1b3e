"""The options of the supervised stages on the trunk: `hydrappo reward` (a reward branch from
preference pairs), `hydrappo dpo` (the policy from preference pairs) and `hydrappo sft`. They share the model and LoRA sections of an RL run
(options.py); sections.py puts them together per command."""

from __future__ import annotations

from dataclasses import dataclass

from .options import DataArgs, OptimizerArgs, RunArgs, _with_default, option
from .values import POSITIVE, LrScheduler, Range, RewardPooling, rows, steps, tokens


@dataclass
class StageTrainArgs(OptimizerArgs, RunArgs):
    """Options of the supervised stages (reward model, SFT) that are not about data."""

    epochs: int = option(1, "Passes over the training data.", steps(0))
    max_steps: int = option(
        0,
        "Stop after this many optimizer steps (0: after `epochs`).",
        steps(0, fix="use N > 0 to stop after N steps, or 0 to run `epochs` passes"),
    )
    batch_size: int = option(
        16, "Examples (preference pairs, or prompt/response pairs) per optimizer step, over all processes.", rows(1)
    )
    eval_batch_size: int = option(32, "Examples per evaluation forward pass.", rows(1))
    adam_beta2: float = _with_default(OptimizerArgs, "adam_beta2", 0.999)
    lr_scheduler: LrScheduler = _with_default(OptimizerArgs, "lr_scheduler", "linear")
    cache_split_hidden: bool = option(
        False,
        "Keep the frozen bottom layers' output of every example in memory after the first epoch "
        "(tokens x hidden size floats each): later epochs and evaluations then run only the top layers. "
        "An example whose tokens begin another's (a conversation's rows, one per assistant turn) is not "
        "computed: it reads the first states of the longer one's.",
    )
    save_every: int = _with_default(RunArgs, "save_every", 100)


@dataclass
class BestModelArgs:
    """Keeping the best held-out evaluation of a preference stage, under Hugging Face Trainer's names."""

    load_best_model_at_end: bool = option(
        False,
        "At the end, the trained weights of the held-out evaluation with the best metric_for_best_model are "
        "restored before the final checkpoint (and model) is written, as Hugging Face's Trainer does: early "
        "stopping without guessing the epoch. Needs held-out pairs (data.eval_file or data.eval_fraction > 0).",
    )
    greater_is_better: bool | None = option(
        None, "Whether a larger metric_for_best_model is better (None: yes, unless its name ends in 'loss')."
    )


@dataclass
class RewardTrainArgs(BestModelArgs, StageTrainArgs):
    output_dir: str = option(
        "outputs/reward",
        "Reward checkpoints (checkpoint-<step>), metrics.jsonl and TensorBoard logs (relative to the current directory).",
    )
    learning_rate: float = _with_default(OptimizerArgs, "learning_rate", 5e-5)
    pooling: RewardPooling = option(
        "last",
        "Where the reward head reads the branch's hidden states: last (the last non-padding token) or mean (the mean over the response tokens). Recorded in the checkpoint; PPO's scoring uses what the branch was trained with.",
    )
    reward_heads: int = option(
        1,
        "Reward heads on the branch: K > 1 trains an ensemble of K linear heads on the branch's shared layers, each "
        "on its own bootstrap resample of the pairs (with `bootstrap`), scored in PPO by reward.ensemble_objective "
        "(Coste et al. 2023). Recorded in the checkpoint.",
        Range(1, 64, fix="use 1 for one head, or e.g. 4 for an ensemble"),
    )
    metric_for_best_model: str = option(
        "eval/accuracy",
        "The held-out statistic load_best_model_at_end keeps the best of (the 'eval/' may be left out).",
    )
    lm_loss_weight: float = option(
        0.0,
        "GRM's regulariser (Yang et al. 2024, arXiv 2406.10216): this weight times the mean negative log-likelihood of "
        "the chosen answers' tokens, read from the branch's hidden states by the model's frozen LM head, added to the "
        "Bradley-Terry loss, so that the branch stays a language model's layers as it learns to rank (0: off).",
        Range(0, fix="use e.g. 0.01, or 0 for off"),
    )
    bootstrap: bool = option(
        True,
        "With reward_heads > 1, weigh each pair for each head by a Poisson(1) count drawn from train.seed (the "
        "online bootstrap): the heads see different resamples of the pairs. False: every head sees every pair, and "
        "they differ only by their initialisation.",
    )


@dataclass
class SFTTrainArgs(StageTrainArgs):
    output_dir: str = option(
        "outputs/sft",
        "The fine-tuned model directory (plus checkpoints, metrics.jsonl and TensorBoard logs), relative to the current directory.",
    )


@dataclass
class StageDataArgs:
    """The data options both supervised stages share: where the rows are, what is held out, and how
    prompt and response become tokens."""

    train_file: str | None = option(
        None,
        "Training rows (hydrappo reward: preference pairs; hydrappo sft: prompt/response pairs): a "
        "jsonl/json/csv/parquet file or directory, a save_to_disk or Hub-layout folder, or a datasets name.",
    )
    eval_file: str | None = option(None, "Held-out rows (default: eval_fraction of the training prompts).")
    eval_fraction: float = option(
        0.1,
        "Fraction of the prompts held out for evaluation when there is no eval_file.",
        Range(0, 1, high_open=True, fix="use e.g. 0.1, or 0 to hold nothing out"),
    )
    split: str = option("train", "Split of train_file when it is a datasets name or Hub-layout folder.")
    eval_split: str | None = option(None, "Split of eval_file (default: the same as split).")
    # the same options as in an RL run's data section
    subset: str | None = _with_default(DataArgs, "subset", None)
    apply_chat_template: bool = _with_default(DataArgs, "apply_chat_template", False)
    system_prompt: str | None = _with_default(DataArgs, "system_prompt", None)
    max_prompt_length: int = _with_default(DataArgs, "max_prompt_length", 64)  # tokenize_prompts cuts both the same way
    max_response_length: int = option(64, "Longer responses keep their first tokens.", tokens(1))
    append_eos: bool = option(True, "End each response with EOS, as a finished PPO response does.")


@dataclass
class PairDataArgs(StageDataArgs):
    """Preference pairs, read by preferences.py in any of TRL's three formats: standard (prompt,
    chosen, rejected as text), conversational (message lists) or implicit prompt (chosen and
    rejected only: their shared beginning is the prompt)."""

    prompt_column: str | None = option(
        "prompt",
        "Column of the prompt: text or a message list. A table without it: the prompt is the shared beginning of "
        "chosen and rejected (TRL's implicit prompt). null (reward stage): chosen/rejected hold whole texts.",
    )
    chosen_column: str = option("chosen", "Column of the preferred answer: text or a message list (its turns).")
    rejected_column: str = option("rejected", "Column of the other answer: text or a message list (its turns).")
    max_length: int | None = option(
        None,
        "At most this many tokens of prompt + answer (TRL's max_length): answers are cut to what the prompt leaves, "
        "and a pair whose prompt leaves no room is skipped and counted (None: max_prompt_length + max_response_length).",
        tokens(2),
    )


@dataclass
class PreferenceDataArgs(PairDataArgs):
    """`hydrappo reward`'s rows: a prompt, a chosen and a rejected response (train_file: preference pairs)."""

    margin_column: str | None = option(None, "Optional column of margins m: loss -log sigmoid(r_c - r_r - m).")
    stats_file: str | None = option(
        None,
        "Reference set for the score mean/std stored with the checkpoint: prompts (responses are sampled "
        "from the base model) or prompt/response rows. Default: chosen and rejected of the training pairs.",
    )
    stats_response_column: str = option("response", "Response column of stats_file, if it has one.")
    stats_max_samples: int = option(1024, "At most this many texts for the score statistics.", rows(1))
    stats_max_new_tokens: int = option(32, "Response length when sampling for stats_file prompts.", tokens(1))
    stats_temperature: float = option(1.0, "Sampling temperature for stats_file prompts (use PPO's).", POSITIVE)


@dataclass
class DPODataArgs(PairDataArgs):
    """`hydrappo dpo`'s rows: preference pairs, as the reward stage reads them."""


@dataclass
class DPOTrainArgs(BestModelArgs, StageTrainArgs):
    output_dir: str = option(
        "outputs/dpo",
        "The trained model directory (plus checkpoints, metrics.jsonl and TensorBoard logs), relative to the current "
        "directory.",
    )
    learning_rate: float = _with_default(OptimizerArgs, "learning_rate", 1e-6)
    metric_for_best_model: str = option(
        "eval/rewards/accuracies",
        "The held-out statistic load_best_model_at_end keeps the best of (the 'eval/' may be left out).",
    )


@dataclass
class DPOArgs:
    """The preference loss of `hydrappo dpo` (algo/preference.py), under TRL's DPOConfig names."""

    beta: float = option(
        0.1,
        "The implicit reward's scale, beta * (policy - reference) log-probs: higher keeps the policy nearer the "
        "reference (DPO's beta; IPO's 1 / (2 beta) is its target gap; SimPO's reward scale).",
        POSITIVE,
    )
    loss_type: str = option(
        "sigmoid",
        "sigmoid (DPO) | robust (robust DPO) | ipo | hinge (SLiC) | simpo (reference-free) | sft (the chosen "
        "answer's NLL); several as a YAML list or comma-separated text, summed with loss_weights "
        "(e.g. [sigmoid, sft]: RPO).",
    )
    loss_weights: list[float] | None = option(None, "One weight per loss_type (None: 1 each).")
    label_smoothing: float = option(
        0.0,
        "The probability that a pair's label is flipped: conservative DPO (sigmoid) or robust DPO (robust); below 0.5.",
        Range(0, 0.5, high_open=True, fix="use e.g. 0.1, or 0 for labels taken as right"),
    )
    simpo_gamma: float = option(0.5, "SimPO's target margin gamma (loss_type: simpo).", Range(0))

    @property
    def loss_types(self) -> tuple[str, ...]:
        """loss_type as a tuple of names."""
        items = self.loss_type if isinstance(self.loss_type, (list, tuple)) else str(self.loss_type).split(",")
        return tuple(str(item).strip() for item in items if str(item).strip())


@dataclass
class SFTDataArgs(StageDataArgs):
    """`hydrappo sft`'s rows: a prompt and the response the model learns (train_file: prompt/response pairs)."""

    prompt_column: str = option("prompt", "Column of the prompt (no loss on its tokens).")
    response_column: str = option("response", "Column of the response the model learns.")
