"""The options of `hydrappo generate` and `hydrappo compare`, declared once (config/command_line.py):
the reward that scores, how many prompts, how long and how hot, where the table goes. Their counts and
the temperature take the rule and help of the config options they stand for (generation.max_new_tokens,
generation.temperature, data.max_prompt_length)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..config import DataArgs, GenerationArgs
from ..config.command_line import argument
from ..config.values import Range

TRUST_HELP = (
    "score with the reward function named in the checkpoint's config.yaml. That is running code that came with "
    "the checkpoint: only for checkpoints you trust (otherwise name the function yourself with --reward_fn)"
)
OVERWRITE_HELP = "replace an existing --output file: it is moved to a sibling NAME.previous-<time>, never deleted"


@dataclass
class ScoringOptions:
    """What generate and compare do alike: the reward that scores, how many prompts, how long, how hot, where to."""

    reward_fn: list[str] | None = argument(
        None,
        "'module:function' or 'file.py:function' that scores the responses; several: repeat it or separate them "
        "with commas, as reward.reward_fn (default: none; see --trust_checkpoint_code)",
        repeat=True,
    )
    reward_weights: list[float] | None = argument(
        None, "one weight per --reward_fn (default 1 each), as reward.reward_weights"
    )
    limit: int | None = argument(None, "use only the first N prompts", range=Range(1, fix="give a positive number"))
    max_new_tokens: int | None = argument(None, like=(GenerationArgs, "max_new_tokens"))
    temperature: float | None = argument(None, like=(GenerationArgs, "temperature"))
    greedy: bool = argument(
        False,
        "take the most likely token at every step, as held-out evaluation during training does "
        "(train.eval_greedy), instead of sampling at the run's (or --temperature's) temperature",
    )
    seed: int = argument(0, "the sampling seed")
    output: str | None = argument(None, "also write the table to FILE (.md table, .html or .jsonl rows)")
    overwrite: bool = argument(False, OVERWRITE_HELP, names=("--overwrite_output_dir",))
    trust_checkpoint_code: bool = argument(False, TRUST_HELP)


@dataclass
class GenerateOptions(ScoringOptions):
    checkpoint: str | None = argument(
        None, "a checkpoint folder (output_dir/checkpoint-<step>) or an output_dir (newest)", positional=True
    )
    prompts: str | None = argument(
        None, "prompts file (default: the held-out items of the run's task, else its training prompts)"
    )
    prompt_column: str | None = argument(None, "the prompts file's column of prompts (default: the run's)")
    no_base: bool = argument(False, "skip the base model's responses")


@dataclass
class CompareOptions(ScoringOptions):
    models: list[str] | None = argument(
        None,
        "checkpoint or run folders, model directories or Hub ids, optionally NAME=PATH",
        positional=True,
        nargs="+",
    )
    prompts: str | None = argument(
        None, "prompts file (jsonl/csv/parquet/txt); without it, the held-out items of the first checkpoint's task"
    )
    prompt_column: str = argument("prompt", "the prompts file's column of prompts")
    chat_template: Literal["auto", "yes", "no"] = argument(
        "auto", "wrap prompts with each model's chat template (auto: as the first checkpoint was trained)"
    )
    max_prompt_length: int | None = argument(None, like=(DataArgs, "max_prompt_length"))
