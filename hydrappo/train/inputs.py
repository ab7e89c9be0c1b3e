"""What a training stage reads, and checks, before it writes anything or loads a model: its
data tables (their columns) and, for RL, the reward functions (imported, their signatures and
the columns they need checked against both tables).

`hydrappo train | reward | sft` reads them before it claims train.output_dir (cli.py), and a
trainer built in Python reads them when it is built, before `train()` claims the folder; so a
bad column, signature or file is refused with nothing written and no earlier run moved aside.
What the trainer does with them later (tokenizing, scoring) needs the model's tokenizer.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field

from ..data import DataError, load_prompt_table, read_sft_table, read_table, split_by_prompt
from ..preferences import prompt_groups, read_preference_table
from .. import usercode
from ..rewards import is_missing, reward_functions
from ..agent.rollouts import load_agent_code
from ..tasks import task_from_args


def table_label(setting: str, value) -> str:
    """How a message names a table: `data.prompts=PATH`, or the option and what was given in Python."""
    if isinstance(value, (str, os.PathLike)):
        return f"{setting}={value}"
    return f"{setting} (the {type(value).__name__} given in Python)"


@dataclass
class RLInputs:
    """PPO's: the prompts (texts or message lists) and their other columns, the reward functions,
    and the same of the held-out table."""

    prompts: list
    columns: dict[str, list]
    functions: list
    eval_prompts: list
    eval_columns: dict[str, list]
    agent_code: dict | None = None  # tools, environments, parser (agent/rollouts.py), loaded and checked
    task: object = None  # the task that made the prompts and its verifiers (a tasks/base.py Task), or None
    shared_sources: list = field(default_factory=list)  # the task's verifiers: one weight (rewards/sources.py)


@dataclass
class StageInputs:
    """The reward and SFT stages': the training table, the held-out one (data.eval_file) or the
    rows of the training table held out (data.eval_fraction), and the reward stage's stats table."""

    train: dict
    train_rows: list[int]
    eval: dict | None = None
    eval_rows: list[int] | None = None
    stats: dict | None = None


def read_rl_inputs(config) -> RLInputs:
    if config.task.enabled:
        return read_task_inputs(config)
    data = config.data
    prompts, columns = load_prompt_table(data.prompts, data.prompt_column, data.split, data.subset)
    setting = table_label("data.prompts", data.prompts)
    # Episodes also hand the rewards their transcripts and environments (agent/rollouts.py).
    extra = ["transcripts", "environments"] if config.agent.enabled else []
    functions = reward_functions(config.reward, columns=list(columns) + extra, setting=setting)
    check_needed_values(functions, columns, setting)
    eval_prompts, eval_columns = [], {}
    if data.eval_prompts:
        eval_prompts, eval_columns = load_prompt_table(
            data.eval_prompts, data.prompt_column, data.eval_split, data.subset, setting="data.eval_prompts"
        )
        setting = table_label("data.eval_prompts", data.eval_prompts)
        for function in functions:
            function.check_columns(list(eval_columns) + extra, setting=setting)
        check_needed_values(functions, eval_columns, setting)
    return RLInputs(prompts, columns, functions, eval_prompts, eval_columns, load_agent_code(config))


def read_task_inputs(config) -> RLInputs:
    """A task's: its items as the prompts and held-out prompts, its verifiers beside the reward
    functions (which may read the task's columns, e.g. task, answer, item), sharing one weight."""
    task = task_from_args(config.task)
    columns = [*task.columns, *(["transcripts", "environments"] if config.agent.enabled else [])]
    functions = reward_functions(config.reward, columns=columns, setting="task")
    train, held_out = task.rows("train"), task.rows("eval")
    return RLInputs(
        [row["prompt"] for row in train],
        {name: [row[name] for row in train] for name in task.columns},
        functions,
        [row["prompt"] for row in held_out],
        {name: [row[name] for row in held_out] for name in task.columns} if held_out else {},
        load_agent_code(config),
        task=task,
        shared_sources=task.reward_sources(columns),
    )


def check_needed_values(functions, columns: dict[str, list], setting: str) -> None:
    """Every row's value of each column a reward function needs (a parameter without a default) is
    there: a missing one would fail mid-run, at whichever step first draws that row."""
    for function in functions:
        for name, parameter in function.parameters.items():
            if name not in columns or parameter.default is not inspect.Parameter.empty:
                continue
            rows = [i for i, value in enumerate(columns[name]) if is_missing(value)]
            if rows:
                shown = ", ".join(map(str, rows[:10])) + (f" and {len(rows) - 10} more" if len(rows) > 10 else "")
                raise DataError(
                    f"{setting}: row {rows[0]} (counting from 0) has no value in column {name!r} (None), which "
                    f"reward.reward_fn={function.spec!r} needs (its parameter {name!r} has no default); {len(rows)} of "
                    f"{len(columns[name])} rows lack it (rows {shown}). Fill them in or drop those rows, or give the "
                    "parameter a default and handle None in the function."
                )


def _held_out(config, train: dict, prompts: list, read) -> StageInputs:
    """The held-out part of a stage's data: data.eval_file, or a seeded share of the prompts."""
    data = config.data
    if data.eval_file:
        return StageInputs(
            train, list(range(len(prompts))), eval=read(data.eval_file, data, "data.eval_file", data.eval_split)
        )
    train_rows, eval_rows = split_by_prompt(prompts, data.eval_fraction, config.train.seed)
    if not train_rows:
        raise DataError(f"data.eval_fraction={data.eval_fraction} holds out every prompt of data.train_file; lower it.")
    return StageInputs(train, train_rows, eval_rows=eval_rows)


def read_reward_inputs(config) -> StageInputs:
    data = config.data
    train = read_preference_table(data.train_file, data)
    inputs = _held_out(config, train, prompt_groups(train, data), read_preference_table)
    if data.stats_file is not None:
        prompt_column = data.prompt_column or "prompt"
        inputs.stats = read_table(
            data.stats_file,
            [prompt_column],
            [data.stats_response_column],
            setting="data.stats_file",
            options={prompt_column: "data.prompt_column"},
        )
    return inputs


def read_pair_inputs(config) -> StageInputs:
    """DPO's: the pairs, held out by prompt."""
    train = read_preference_table(config.data.train_file, config.data)
    return _held_out(config, train, prompt_groups(train, config.data), read_preference_table)


def read_sft_inputs(config) -> StageInputs:
    train = read_sft_table(config.data.train_file, config.data)
    return _held_out(config, train, train[config.data.prompt_column], read_sft_table)


def read_inputs(config):
    """The inputs of the stage `config` configures (a Config, RewardConfig, DPOConfig or SFTConfig)."""
    readers = {
        "Config": read_rl_inputs,
        "RewardConfig": read_reward_inputs,
        "DPOConfig": read_pair_inputs,
        "SFTConfig": read_sft_inputs,
    }
    with usercode.one_module_per_file():  # a reward and an environment from one file share its module
        return readers[type(config).__name__](config)
