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
import logging
from pathlib import Path

import torch

from ..config import (
    Config,
    ConfigError,
    GenerationArgs,
    ModelConfig,
    Problems,
    RewardArgs,
    check_reward_fn,
    looks_like_a_path,
)
from ..config.command_line import range_problems
from ..config.paths import check_model_location, writable_folder_problem
from ..config.reward_sources import reward_source_names
from ..data import PromptSet, load_prompt_table, pack_sequences, tokenize_prompts
from ..generation.samplers import build_sampler
from ..rewards import build_reward_source, reward_functions
from ..storage.checkpoint import (
    CheckpointError,
    find_checkpoint,
    is_checkpoint_folder,
    latest_checkpoint,
    load_checkpoint_config,
    load_trainable_weights,
    seed_everything,
)
from ..storage.export import load_checkpoint_hydra, reward_branch_location
from ..storage.reward_branch import load_reward_branch
from ..storage.models import build_hydra, load_model_and_tokenizer, pick_device
from ..storage.rundir import refuse_own_inputs, with_run_folders
from ..tasks import Task, task_from_args
from .heldout import answer_and_score
from .options import CompareOptions

logger = logging.getLogger("hydrappo")


def branch_scores(hydra, responses, pad_token_id: int) -> torch.Tensor | None:
    """The attached reward branch's scores of prompt + response, (B,) or (B, K) for K heads, as PPO's
    experience pass reads them (log-probs from the response on, so a mean-pooled branch averages the
    response's tokens); None without a branch (or for a plain transformers model)."""
    if getattr(hydra, "reward_branch", None) is None:
        return None
    ids, mask, _, width = pack_sequences(responses.prompt_ids, responses.response_ids, pad_token_id)
    with torch.no_grad():
        out = hydra.forward_hydra(
            ids.to(hydra.device), mask.to(hydra.device), return_reference=False, logprobs_from=width - 1
        )
    return out.scores


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
            branch_scores=branch_scores(hydra, responses, tokenizer.pad_token_id),
        )
        return scored.total, None

    torch.manual_seed(seed)
    was_training = hydra.training
    hydra.eval()
    # The same "answer and score" path as held-out evaluation during training (evaluation/heldout.py).
    answers = answer_and_score(prompts, list(range(len(prompts))), answer, score if reward_source else None, tokenizer)
    hydra.train(was_training)
    return [{key: row[key] for key in ("prompt", "response", "score", "ended", "degenerate")} for row in answers]


def _generation(defaults: GenerationArgs, max_new_tokens: int | None, temperature: float | None) -> GenerationArgs:
    return dataclasses.replace(
        defaults,
        max_new_tokens=max_new_tokens or defaults.max_new_tokens,
        temperature=temperature if temperature is not None else defaults.temperature,
    )


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
    config: Config, reward_fn, trust_checkpoint_code: bool, checkpoint, reward_weights=None, branch: bool = True
) -> RewardArgs | None:
    """The reward to score with: `reward_fn` (one spec, comma-separated specs or a list, weighted by
    `reward_weights`) from the command line; else the checkpoint's reward functions, with the run's
    weights, only with `trust_checkpoint_code` (it is code); else, for a run scored by its reward branch
    alone, that branch (weights, data) with the run's ensemble objective, where `branch` says the caller
    can attach it to the run's trunk; else its reward model (a folder of weights, data); else None."""
    if reward_fn:
        return RewardArgs(reward_fn=reward_specs(reward_fn), reward_weights=reward_weights)
    if config.reward.use_reward_branch and not config.reward.reward_fn and config.model.reward_branch_path:
        if branch:
            return RewardArgs(
                use_reward_branch=True,
                ensemble_objective=config.reward.ensemble_objective,
                ensemble_std_weight=config.reward.ensemble_std_weight,
            )
        logger.warning(
            "not scoring with the reward branch %s names: a branch scores on its own run's trunk, which the other "
            "models do not share. `hydrappo generate %s` scores the base and the trained policy with it.",
            Path(checkpoint) / "config.yaml",
            checkpoint,
        )
        return None
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
    if reward_args is not None and reward_args.use_reward_branch:  # the run's branch, on the run's own trunk
        hydra.attach_reward_branch(load_reward_branch(hydra, reward_branch_location(config, checkpoint)))
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
            trained_config, reward_fn, trust_checkpoint_code, trained[0].rpartition("=")[2], reward_weights, False
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
