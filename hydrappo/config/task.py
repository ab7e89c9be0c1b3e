"""The `task:` section: a task library's task (reasoning-gym's by default) as a run's prompts AND its
reward, in one place (tasks/registry.py builds it with the library task.task_library names;
docs/reasoning-tasks.md).

    task:
      task_name: chain_sum             # or `tasks:` a mix, {name: {weight: w, config: {...}}}
      task_config: {min_terms: 2, max_terms: 3}
      task_size: 1000                  # training items
      task_eval_size: 100              # held-out items, never a training question
      task_seed: 0

The option names carry the `task_` prefix because every option is also a command-line flag of
its own (`--task_name chain_sum`), and `--seed` / `--size` would collide. What needs the library
(is the library known, is the name a task, are its options valid) is checked when the run reads
its inputs, still before any model loads (train/inputs.py); this module checks what the options
alone say.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from ..errors import Problem
from .options import option
from .values import Range, rows

# No example answer in it: SmolLM2-135M-Instruct copied "e.g. <answer>42</answer>" as its answer to every question.
DEFAULT_INSTRUCTION = "Give only your final answer, between <answer> and </answer> tags."


@dataclass
class TaskArgs:
    task_library: str = option(
        "reasoning_gym",
        "The task library whose task this section names (tasks/registry.py's LIBRARIES): reasoning_gym. Its "
        "task_name / tasks, task_config and the other options below are read by that library.",
    )
    task_name: str | None = option(
        None,
        "A reasoning-gym task (e.g. chain_sum, basic_arithmetic) as the run's prompts and reward: its "
        "questions are the prompts, its own score_answer the reward. Needs `pip install hydrappo[reasoning]`.",
    )
    tasks: str | None = option(
        None,
        "Several reasoning-gym tasks mixed, instead of task_name: a YAML mapping "
        "{name: {weight: w, config: {...}}} (or {name: weight}); items are dealt in proportion to the weights "
        "and each task's reward is logged as env/reward/<name> and eval/reward/<name>.",
    )
    task_config: str | None = option(
        None,
        "The task's own options (reasoning-gym's config fields), a YAML mapping, e.g. "
        "{min_terms: 2, max_terms: 3} (on the command line: --task_config '{max_terms: 3}').",
    )
    task_size: int = option(1000, "Training items.", rows(1))
    task_eval_size: int = option(
        0,
        "Held-out items (0: none), answered at step 0, every train.eval_every steps and at the end; "
        "drawn from seeds training never uses, and none is a training question.",
        rows(0),
    )
    task_seed: int = option(
        0,
        "Seed of the items (not train.seed: runs of different train.seed see the same questions).",
        Range(0, 2**32 - 1),
    )
    task_instruction: str = option(
        DEFAULT_INSTRUCTION,
        "Appended to every question: how to give the answer so that reasoning-gym's extract_answer "
        "reads it (the <answer> tags).",
    )
    task_answer_start: str | None = option(
        None,
        "Text the response starts with, e.g. '<answer>': written as the start of the assistant's turn "
        "(the prompts become message lists, which need the tokenizer's chat template), so the model writes the "
        "answer and the closing tag; the verifier reads the start and the response together.",
    )

    task_partial_credit: bool = option(
        True,
        "Keep the scorer's partial credit (reasoning-gym's default scorer pays len(answer) / len(reply) to a reply "
        "that contains the answer). false: an answer scores 1 when the scorer gives it full marks, else 0 (a small "
        "model paid for containing the answer learns to write strings of numbers: examples/reasoning).",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.task_name or self.tasks)


def yaml_mapping(value) -> tuple[dict | None, str | None]:
    """(the mapping, None) of a mapping option as YAML gives it, or as the text the command line
    gave; (None, what is wrong) otherwise. None is the empty mapping."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as error:
            return None, f"is not a YAML mapping ({str(error).splitlines()[0]})"
    if value is None:
        return {}, None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        return None, f"must be a mapping of names to values, e.g. {{max_terms: 3}}, not {type(value).__name__}"
    return value, None


MIX_EXAMPLE = "{chain_sum: {weight: 2, config: {max_terms: 3}}, basic_arithmetic: 1}"


def _mix_entry(name: str, entry) -> tuple[tuple[str, float, dict] | None, Problem | None]:
    """One entry of task.tasks: {weight, config}, or just the weight."""
    if isinstance(entry, (int, float)) and not isinstance(entry, bool):
        entry = {"weight": entry}
    if not isinstance(entry, dict) or set(entry) - {"weight", "config"}:
        return None, Problem(
            f"task.tasks.{name}", entry, "must be {weight: w, config: {...}} or a weight", f"write e.g. {MIX_EXAMPLE}"
        )
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
        return None, Problem(f"task.tasks.{name}.weight", weight, "must be a positive number", "use e.g. 1")
    options, wrong = yaml_mapping(entry.get("config"))
    if wrong:
        return None, Problem(f"task.tasks.{name}.config", entry.get("config"), wrong, "write e.g. {max_terms: 3}")
    return (name, float(weight), options), None


def task_specs(task: TaskArgs) -> tuple[list[tuple[str, float, dict]], list[Problem]]:
    """([(name, weight, the task's options)] the section names, in order; the problems found)."""
    if task.task_name and task.tasks:
        return [], [Problem("task.tasks", task.tasks, "and task.task_name both name the task", "keep one of them")]
    if task.task_name:
        if not isinstance(task.task_name, str):
            return [], [
                Problem("task.task_name", task.task_name, "must be one name", f"for several use tasks: {MIX_EXAMPLE}")
            ]
        options, wrong = yaml_mapping(task.task_config)
        if wrong:
            return [], [Problem("task.task_config", task.task_config, wrong, "write e.g. {max_terms: 3}")]
        return [(task.task_name, 1.0, options)], []
    problems = []
    if task.task_config is not None:
        problems.append(
            Problem(
                "task.task_config",
                task.task_config,
                "is only read with task.task_name",
                "put each task's options into its entry of task.tasks ({name: {weight: 1, config: {...}}})",
            )
        )
    mix, wrong = yaml_mapping(task.tasks)
    if wrong or not mix:
        return [], [*problems, Problem("task.tasks", task.tasks, wrong or "names no task", f"write {MIX_EXAMPLE}")]
    specs = []
    for name, entry in mix.items():
        spec, problem = _mix_entry(name, entry)
        specs += [spec] if spec else []
        problems += [problem] if problem else []
    return specs, problems


def check_task(config, problems) -> None:
    """Problems of the task section and of what it replaces (data.prompts / data.eval_prompts), added to
    `problems` (config/problems.py's Problems)."""
    task = config.task
    if not task.enabled:
        for name in ("task_config", "task_eval_size"):
            if getattr(task, name):
                problems.add(f"task.{name}", getattr(task, name), "needs task.task_name or task.tasks", "set one")
        return
    specs, found = task_specs(task)
    problems.report(*found)
    for name, what in (("prompts", "the prompts"), ("eval_prompts", "the held-out prompts (task.task_eval_size)")):
        if getattr(config.data, name):
            problems.add(
                f"data.{name}",
                getattr(config.data, name),
                f"and the task section both give {what}",
                f"remove data.{name} (the task's questions are the prompts), or the task section",
            )
    if specs and 0 < task.task_eval_size < len(specs):
        problems.add(
            "task.task_eval_size",
            task.task_eval_size,
            f"is smaller than the number of tasks ({len(specs)}), so some task would have no held-out item",
            f"use at least {len(specs)}, or 0 for none",
        )
    if specs and task.task_size < len(specs):
        problems.add("task.task_size", task.task_size, f"gives fewer items than tasks ({len(specs)})", "raise it")
    if task.task_eval_size and config.train.fsdp_trunk:
        problems.add(
            "task.task_eval_size",
            task.task_eval_size,
            "is not supported with train.fsdp_trunk yet (a sharded trunk generates in lockstep)",
            "set task_eval_size: 0 and evaluate the checkpoints afterwards, or train without fsdp_trunk",
        )


def held_out_off(config) -> bool:
    """Whether held-out evaluation is switched off: data.eval_prompts is empty text (`--eval_prompts ""`),
    which no file is, so that one command-line value stops it whatever the config file sets (its
    eval_* options and a task's held-out items then carry no meaning)."""
    return getattr(config.data, "eval_prompts", None) == ""


def has_held_out(config) -> bool:
    """Whether the run has held-out prompts: data.eval_prompts, or a task's held-out items."""
    task = getattr(config, "task", None)
    if held_out_off(config):
        return False
    return bool(config.data.eval_prompts or (task is not None and task.enabled and task.task_eval_size))


def has_prompts(config) -> bool:
    """Whether the run has prompts: data.prompts, or a task's questions."""
    task = getattr(config, "task", None)
    return config.data.prompts is not None or (task is not None and task.enabled)
