"""Generate for a prompts file, score with a reward function, compare models side by side.

`hydrappo generate CHECKPOINT --prompts FILE` shows the base model's and the trained
policy's responses with their scores and the mean of each (like trlX's GPT / SFT / PPO
comparison); the base model's answers come from the same trunk before the checkpoint's
weights are loaded into it, so only one model is in memory. `hydrappo compare A B C`
does the same for any number of checkpoints and model directories.

A run with a task (its config's `task:` section, e.g. reasoning-gym's) is answered on the task's held-out
items, the ones a training run evaluates on, unless `--prompts` names other prompts; the task's
own verifier scores them (the library's scorer: no code the checkpoint names), beside whatever
reward functions the command line names or trusts, weighted as the run weighed them.

A checkpoint is data: its config.yaml names the reward function the run used, but that code
runs only when the user asks for it, by naming a reward function on the command line
(`--reward_fn`) or with `--trust_checkpoint_code`. Otherwise the responses are shown unscored,
with a note saying how to score them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from .config import (
    Config,
    ConfigError,
    DataArgs,
    GenerationArgs,
    ModelConfig,
    Problems,
    RewardArgs,
    check_reward_fn,
    looks_like_a_path,
)
from .config.command_line import argument, range_problems
from .config.values import Range
from .config.paths import check_model_location, writable_folder_problem
from .data import PromptSet, load_prompt_table, tokenize_prompts
from .generation.samplers import build_sampler
from .rewards import build_reward_source, reward_functions
from .config.reward_sources import reward_source_names
from .storage.checkpoint import (
    CheckpointError,
    find_checkpoint,
    is_checkpoint_folder,
    latest_checkpoint,
    load_checkpoint_config,
    load_trainable_weights,
    seed_everything,
)
from .storage.export import load_checkpoint_hydra
from .train.heldout import answer_and_score
from .storage.models import build_hydra, load_model_and_tokenizer
from .storage.rundir import move_aside, refuse_own_inputs, with_run_folders
from .tasks import Task, task_from_args
from .train.precision import pick_device

logger = logging.getLogger("hydrappo")


def generate_and_score(
    hydra,
    tokenizer,
    prompts: PromptSet,
    generation: GenerationArgs,
    reward_source,
    seed: int = 0,
    columns: dict | None = None,
    greedy: bool = False,
):
    """One sampled (or with `greedy`, the most likely) response per prompt, and its score (the
    reward functions get the prompts' other `columns`). Seeded, so that two models compared on the
    same prompts see the same random numbers."""
    sampler = build_sampler(generation, hydra, tokenizer)

    def answer(prompt_ids, rows):
        return sampler.sample(prompt_ids, generation, greedy=greedy)

    def score(rows, prompt_texts, responses):
        texts = tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)
        scored = reward_source(
            [p + r for p, r in zip(prompt_texts, texts)],
            prompt_texts,
            texts,
            columns={name: [values[i] for i in rows] for name, values in (columns or {}).items()},
            completion_ids=responses.response_ids,
            prompt_messages=[prompts.messages[i] for i in rows] if prompts.messages else None,
        )
        return scored.total, None

    torch.manual_seed(seed)
    was_training = hydra.training
    hydra.eval()
    # The same "answer and score" path as held-out evaluation during training (train/heldout.py).
    answers = answer_and_score(prompts, list(range(len(prompts))), answer, score if reward_source else None, tokenizer)
    hydra.train(was_training)
    return [{key: row[key] for key in ("prompt", "response", "score", "ended", "degenerate")} for row in answers]


def mean_score(rows: list[dict]) -> float | None:
    scores = [row["score"] for row in rows if row["score"] is not None]
    return statistics.fmean(scores) if scores else None


def side_by_side_markdown(columns: dict[str, list[dict]]) -> str:
    """A markdown table: one row per prompt, a response and score column per model."""

    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    names = list(columns)
    header = "| prompt | " + " | ".join(f"{name} | score" for name in names) + " |"
    lines = [header, "|" + " --- |" * (1 + 2 * len(names))]
    for index, first in enumerate(columns[names[0]]):
        parts = [cell(first["prompt"])]
        for name in names:
            row = columns[name][index]
            parts += [cell(row["response"]), "" if row["score"] is None else f"{row['score']:.3f}"]
        lines.append("| " + " | ".join(parts) + " |")
    means = [mean_score(columns[name]) for name in names]
    lines.append("| **mean** | " + " | ".join(f" | {'' if m is None else f'**{m:.3f}**'}" for m in means) + " |")
    return "\n".join(lines)


def side_by_side_text(columns: dict[str, list[dict]], width: int = 60) -> str:
    """The same comparison for a terminal: blocks per prompt, then the means."""
    import textwrap

    out = []
    for index, first in enumerate(columns[next(iter(columns))]):
        out.append(f"[{index + 1}] {first['prompt']}")
        for name, rows in columns.items():
            row = rows[index]
            score = "" if row["score"] is None else f"{row['score']:+.3f}"
            wrapped = textwrap.fill(row["response"].strip().replace("\n", " "), width) or "(empty)"
            out.append(textwrap.indent(f"{name} {score}\n{textwrap.indent(wrapped, '  ')}", "    "))
        out.append("")
    for name, rows in columns.items():
        value = mean_score(rows)
        out.append(f"mean score {name}: {'n/a' if value is None else f'{value:.3f}'} over {len(rows)} prompts")
    return "\n".join(out)


def side_by_side_html(columns: dict[str, list[dict]]) -> str:
    import html

    names = list(columns)
    head = "<tr><th>prompt</th>" + "".join(f"<th>{html.escape(n)}</th><th>score</th>" for n in names) + "</tr>"
    rows = []
    for index, first in enumerate(columns[names[0]]):
        cells = [f"<td>{html.escape(first['prompt'])}</td>"]
        for name in names:
            row = columns[name][index]
            score = "" if row["score"] is None else f"{row['score']:.3f}"
            cells += [f"<td>{html.escape(row['response'])}</td>", f"<td>{score}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    means = "".join(
        f"<td></td><td><b>{'' if mean_score(columns[n]) is None else f'{mean_score(columns[n]):.3f}'}</b></td>"
        for n in names
    )
    rows.append(f"<tr><td><b>mean</b></td>{means}</tr>")
    return f"<table border=1 cellpadding=4>\n{head}\n" + "\n".join(rows) + "\n</table>\n"


def write_comparison(columns: dict[str, list[dict]], path: Path, overwrite: bool = False) -> None:
    """The comparison as a .jsonl (a row per model and prompt), .html or markdown table file.
    A file already there is moved to a sibling NAME.previous-<time> (`overwrite`, checked
    before: check_arguments), never overwritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if overwrite and path.exists():
        logger.warning("--output: the existing %s was moved to %s", path, move_aside(path))
    if path.suffix == ".html":
        path.write_text(side_by_side_html(columns))
    elif path.suffix == ".jsonl":
        with path.open("w") as handle:
            for name, rows in columns.items():
                for row in rows:
                    handle.write(json.dumps({"model": name, **row}) + "\n")
    else:
        path.write_text(side_by_side_markdown(columns) + "\n")


def _generation(defaults: GenerationArgs, max_new_tokens: int | None, temperature: float | None) -> GenerationArgs:
    return dataclasses.replace(
        defaults,
        max_new_tokens=max_new_tokens or defaults.max_new_tokens,
        temperature=temperature if temperature is not None else defaults.temperature,
    )


# ---------------------------------------------------------------------------- the commands' options
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


def reward_specs(reward_fn) -> list[str]:
    """--reward_fn's functions: each value given (it may be repeated) split at commas."""
    values = reward_fn if isinstance(reward_fn, (list, tuple)) else [reward_fn] if reward_fn else []
    return RewardArgs(reward_fn=",".join(values)).function_specs


def check_arguments(
    *,
    prompts=None,
    reward_fn=None,
    limit=None,
    max_new_tokens=None,
    temperature=None,
    output=None,
    max_prompt_length=None,
    models=(),
    inputs=None,
    overwrite: bool = False,
    reward_weights=None,
    greedy: bool = False,
) -> None:
    """The options of `generate` and `compare`, all checked before any model loads. --output must
    not be or contain one of `inputs` ({option: path}), nor replace a file inside one (or inside
    the run that holds an input checkpoint); an existing file only with `overwrite`."""
    refuse_own_inputs(output, with_run_folders(inputs or {}), "--output", file=True)
    problems = Problems()
    if output is not None and Path(output).is_file() and not overwrite:
        problems.add(
            "--output",
            output,
            "already exists",
            "choose another file, or pass --overwrite to move the "
            "existing one to a sibling NAME.previous-<time> (nothing is deleted)",
        )
    declared = CompareOptions(
        limit=limit, max_new_tokens=max_new_tokens, temperature=temperature, max_prompt_length=max_prompt_length
    )
    problems.messages.extend(range_problems(declared).messages)
    if greedy and temperature is not None:
        problems.add("--temperature", temperature, "does nothing with --greedy", "pass one of the two")
    if prompts is not None and not Path(prompts).expanduser().exists() and looks_like_a_path(prompts):
        problems.add("--prompts", prompts, "does not exist: no such file or folder", "fix the path")
    specs = reward_specs(reward_fn)
    for spec in specs:
        check_reward_fn(spec, problems, "--reward_fn")
    if reward_weights and specs and len(reward_weights) != len(specs):
        problems.add(
            "--reward_weights",
            reward_weights,
            f"has {len(reward_weights)} weight(s) for {len(specs)} --reward_fn function(s)",
            "give one weight per function, in their order",
        )
    if output is not None:
        suffix = Path(output).suffix
        why = writable_folder_problem(Path(output).expanduser().absolute().parent)
        if Path(output).is_dir():
            problems.add("--output", output, "is a folder", "name a .md, .html or .jsonl file")
        elif why:
            problems.add("--output", output, f"cannot be written: {why}", "choose another file")
        elif suffix not in (".md", ".html", ".jsonl", ".txt", ""):
            problems.add("--output", output, "must end in .md, .html or .jsonl", "choose one of those")
    for spec in models:
        path = spec.rpartition("=")[2] if "=" in spec else spec
        check_model_location(problems, "model", path, "checkpoint or model folder")
    problems.raise_if_any("the command line")


def checkpoint_reward(
    config: Config, reward_fn, trust_checkpoint_code: bool, checkpoint, reward_weights=None
) -> RewardArgs | None:
    """The reward to score with: `reward_fn` (one spec, comma-separated specs or a list, weighted by
    `reward_weights`) from the command line; else the checkpoint's reward functions, with the run's
    weights, only with `trust_checkpoint_code` (it is code); else its reward model (a folder of
    weights, data); else None."""
    if reward_fn:
        return RewardArgs(reward_fn=reward_specs(reward_fn), reward_weights=reward_weights)
    named = config.reward.reward_fn
    if named and trust_checkpoint_code:
        return RewardArgs(
            reward_fn=named,
            timeout_s=config.reward.timeout_s,
            reward_weights=reward_weights or config.reward.reward_weights,
        )
    if named:
        logger.warning(
            "not scoring with %r, the reward function %s names: code a checkpoint names is never run unless you say "
            "so. Read it, then pass --reward_fn %s (or --trust_checkpoint_code) to score the responses with it.",
            named,
            Path(checkpoint) / "config.yaml",
            named,
        )
        return None
    if config.reward.reward_model:
        return RewardArgs(reward_model=config.reward.reward_model, reward_model_label=config.reward.reward_model_label)
    return None


def first_rows(prompts: str, prompt_column: str, limit: int | None) -> tuple[list, dict]:
    """(the prompts, the table's other columns) of a prompts file's first `limit` rows (all: None)."""
    texts, table = load_prompt_table(prompts, prompt_column)
    texts = texts[:limit] if limit else texts
    return texts, {name: values[: len(texts)] for name, values in table.items()}


def task_held_out(config: Config, limit: int | None) -> tuple[Task, dict]:
    """(the run's task, its held-out items' columns, e.g. task / answer / item): the items a training run
    with this config evaluates on (tasks/base.py held_out), the first `limit`; their prompts as the run
    formats them for a tokenizer: task.prompt_set("eval", ...)."""
    task = task_from_args(config.task)
    return task, task.held_out(limit)


def task_reward_source(task: Task, reward_args: RewardArgs | None, device: str):
    """The task's verifiers as the last reward source, as a training run builds them (train/inputs.py),
    beside the sources `reward_args` names (None: the verifiers alone). --reward_weights given one
    per --reward_fn weigh those, and the task weighs 1."""
    reward_args = reward_args or RewardArgs()
    weights = reward_args.reward_weights
    if weights and len(weights) == len(reward_source_names(reward_args)):
        reward_args = dataclasses.replace(reward_args, reward_weights=[*weights, 1.0])
    columns = list(task.columns)
    functions = reward_functions(reward_args, columns=columns, setting="task")
    return build_reward_source(
        reward_args, device=device, functions=functions, shared_weight_sources=task.reward_sources(columns)
    )


def generate(
    checkpoint,
    prompts=None,
    prompt_column=None,
    reward_fn=None,
    limit=None,
    max_new_tokens=None,
    temperature=None,
    no_base=False,
    seed=0,
    trust_checkpoint_code=False,
    reward_weights=None,
    greedy=False,
) -> dict[str, list[dict]]:
    """The base model's and a checkpoint's trained policy's scored responses, by column name: for
    `prompts`, else the run's task's held-out items, else its training prompts. `greedy`: the most
    likely tokens instead of samples."""
    check_arguments(
        prompts=prompts,
        reward_fn=reward_fn,
        limit=limit,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        reward_weights=reward_weights,
        greedy=greedy,
    )
    checkpoint = find_checkpoint(checkpoint)
    config = load_checkpoint_config(checkpoint, Config)
    generation = _generation(config.generation, max_new_tokens, temperature)
    reward_args = checkpoint_reward(config, reward_fn, trust_checkpoint_code, checkpoint, reward_weights)
    task = None
    if prompts is None and config.task.enabled:  # checked (reasoning-gym, the items) before any model loads
        task, table = task_held_out(config, limit)
    elif prompts is None and not config.data.prompts:
        raise CheckpointError(f"{checkpoint} names no training prompts: pass --prompts FILE.")
    device = pick_device(config.train.device)
    # Random-init models are rebuilt from the run's seed, exactly as the trainer built them.
    seed_everything(config.train.seed)
    hydra, tokenizer = build_hydra(config.model, config.lora, device=device, value_head=config.ppo.uses_critic)
    data = config.data
    if task is not None:
        reward_source = task_reward_source(task, reward_args, str(device))
        prompt_set = task.prompt_set("eval", tokenizer, data, limit)  # as the run formats them
    else:
        reward_source = build_reward_source(reward_args, device=str(device)) if reward_args is not None else None
        texts, table = first_rows(prompts or data.prompts, prompt_column or data.prompt_column, limit)
        prompt_set = tokenize_prompts(
            texts, tokenizer, data.max_prompt_length, data.apply_chat_template, data.system_prompt
        )

    columns = {}
    if not no_base:
        columns["base"] = generate_and_score(
            hydra, tokenizer, prompt_set, generation, reward_source, seed, table, greedy
        )
    load_trainable_weights(hydra, checkpoint)
    columns[f"trained ({checkpoint.name})"] = generate_and_score(
        hydra, tokenizer, prompt_set, generation, reward_source, seed, table, greedy
    )
    return columns


def model_location(spec: str) -> tuple[str, str, Path]:
    """(the name given or "", the path, where it points): a run folder points at its newest checkpoint,
    as generate and export take it, unless it holds the whole model the run wrote at its end (an SFT or
    reward stage's folder: config.json beside its checkpoints), which loads as a model directory."""
    name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
    location = Path(path).expanduser()
    whole_model = (location / "config.json").is_file()
    if location.is_dir() and not is_checkpoint_folder(location) and not whole_model and latest_checkpoint(location):
        location = find_checkpoint(location)
    return name, path, location


def load_for_generation(spec: str, device):
    """A model to sample from: a hydrappo checkpoint (its trained policy; a run folder: its newest
    checkpoint), or a model directory / bundled name (loaded as is). Returns (name, model, tokenizer,
    config|None)."""
    name, path, location = model_location(spec)
    if location.is_dir() and is_checkpoint_folder(location):
        hydra, tokenizer, config = load_checkpoint_hydra(location, device=str(device))
        return name or f"{location.parent.name}/{location.name}", hydra, tokenizer, config
    model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=path), device=device)
    return name or (location.name if location.exists() else path), model, tokenizer, None


def compare(
    models: list[str],
    prompts: str | None = None,
    prompt_column="prompt",
    reward_fn=None,
    chat_template="auto",
    limit=None,
    max_new_tokens=None,
    temperature=None,
    max_prompt_length=None,
    seed=0,
    trust_checkpoint_code=False,
    reward_weights=None,
    greedy=False,
) -> dict[str, list[dict]]:
    """Several models on the same prompts with the same sampling seed (or with `greedy`, their most
    likely tokens), scored, by column name. Without `prompts`: the held-out items of the first
    checkpoint's task."""
    check_arguments(
        prompts=prompts,
        reward_fn=reward_fn,
        limit=limit,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        max_prompt_length=max_prompt_length,
        models=models,
        reward_weights=reward_weights,
        greedy=greedy,
    )
    # The first checkpoint's config, read before any model loads: its sampling, reward and task.
    locations = [(spec, model_location(spec)[2]) for spec in models]
    trained = next(
        (
            (spec, load_checkpoint_config(at, Config))
            for spec, at in locations
            if at.is_dir() and is_checkpoint_folder(at)
        ),
        None,
    )
    trained_config = trained[1] if trained else None
    task = None
    if prompts is None:
        if trained_config is None or not trained_config.task.enabled:
            raise ConfigError(
                "compare needs --prompts FILE: no checkpoint among the models names a task (task:) whose held-out "
                "items to answer."
            )
        task, table = task_held_out(trained_config, limit)
    device = pick_device("auto")
    loaded = [load_for_generation(spec, device) for spec in models]
    defaults = trained_config or Config()
    generation = _generation(defaults.generation, max_new_tokens, temperature)
    chat = {"yes": True, "no": False, "auto": defaults.data.apply_chat_template}[chat_template]
    if trained_config is not None:
        reward_args = checkpoint_reward(
            trained_config, reward_fn, trust_checkpoint_code, trained[0].rpartition("=")[2], reward_weights
        )
    else:
        reward_args = checkpoint_reward(Config(), reward_fn, False, None, reward_weights)
    if task is not None:
        reward_source = task_reward_source(task, reward_args, str(device))
    else:
        reward_source = build_reward_source(reward_args, device=str(device)) if reward_args is not None else None
        texts, table = first_rows(prompts, prompt_column, limit)
    max_prompt_length = max_prompt_length or defaults.data.max_prompt_length

    columns = {}
    for name, model, tokenizer, _ in loaded:
        if task is not None:  # as a run formats them, for this model's tokenizer
            data = dataclasses.replace(defaults.data, max_prompt_length=max_prompt_length, apply_chat_template=chat)
            prompt_set = task.prompt_set("eval", tokenizer, data, limit)
        else:
            prompt_set = tokenize_prompts(texts, tokenizer, max_prompt_length, chat, defaults.data.system_prompt)
        columns[name] = generate_and_score(model, tokenizer, prompt_set, generation, reward_source, seed, table, greedy)
    return columns
