"""What a run asks of a task library, written once, so that nothing outside tasks/ looks past it.

A task is a run's prompts AND its reward from one place: its items per split as prompt-table rows
(`rows(split)`, with the extra `columns` the reward functions may read), those rows' prompts as a
tokenizer formats them (`prompt_set`, never cut: `fit_prompt_length`), its own verifiers as reward
sources (`reward_sources(columns)`, which share the task's one weight: rewards/sources.py), and its
held-out scoring (`held_out(limit)`: the columns the verifiers read; `names`: the parts whose
solved share is logged as eval/solved/<name>). It is built from the config's `task:` section
(`from_args`) and writes itself back into it (`configure`), so that a run records its task in
config.yaml like any option and a resumed run makes the same items.

A library implements `from_args`, `names`, `rows` and `reward_funcs`; the rest has a default here.
The registry (tasks/registry.py) names each library's class by one line.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from ..config.options import ConfigError
from ..config.task import TaskArgs
from ..prompts import PromptSet, tokenize_prompts
from ..rewards.functions import FunctionReward

logger = logging.getLogger("hydrappo")


class Task(ABC):
    """A task library's items, prompts and verifiers behind the one interface a run reads."""

    columns: tuple[str, ...] = ("task", "item")  # a row's columns besides the prompt (reward functions may read them)
    args: TaskArgs  # the `task:` section it stands for (configure writes it into a config)
    plain_text: str | None = None  # None: prompts for a chat template; else the system prompt (or "") of plain text

    # ------------------------------------------------------------------ what a library implements
    @classmethod
    @abstractmethod
    def from_args(cls, args: TaskArgs) -> Task:
        """The task a config's `task:` section describes; a ConfigError for what the library refuses."""

    @property
    @abstractmethod
    def names(self) -> list[str]:
        """Its tasks' names, in order: each verifier's source name (env/reward/<name>, eval/reward/<name>)
        and the held-out parts whose full-score answers count as solved (eval/solved/<name>)."""

    @abstractmethod
    def rows(self, split: str = "train") -> list[dict]:
        """The split's ("train" or "eval") items as prompt-table rows: {"prompt", *columns}; `prompt` is
        text, or a message list (then it needs the tokenizer's chat template)."""

    @property
    @abstractmethod
    def reward_funcs(self) -> list:
        """One verifier per task, in TRL's reward-function convention (e.g. a `Verifier`)."""

    # ------------------------------------------------------------------ what every task does alike
    def reward_sources(self, columns: list[str]) -> list[TaskReward]:
        """The verifiers as reward sources, checked against the rows' `columns`."""
        return [TaskReward(verifier, columns=columns, setting="task") for verifier in self.reward_funcs]

    def configure(self, config) -> None:
        """Write this task into `config`'s task section (the Python API's `task=`): a run records
        its task in config.yaml like any option, so that a resumed run makes the same items."""
        if not hasattr(config, "task"):
            raise ConfigError(f"task: {type(config).__name__} has no task section; a task is for RL (PPOTrainer).")
        config.task = TaskArgs(**vars(self.args))

    @property
    def train_dataset(self) -> list[dict]:
        return self.rows("train")

    @property
    def eval_dataset(self) -> list[dict]:
        return self.rows("eval")

    def held_out(self, limit: int | None = None) -> dict[str, list]:
        """The columns of the first `limit` held-out rows (all: None), which its verifiers score them by: what
        `hydrappo generate` / `compare` answer without --prompts, the items a training run evaluates on."""
        rows = self.rows("eval")[:limit] if limit else self.rows("eval")
        if not rows:
            raise ConfigError(
                "the run's task has no held-out items (task.task_eval_size is 0): pass --prompts FILE to answer other "
                "prompts."
            )
        return {name: [row[name] for row in rows] for name in self.columns}

    def use_plain_text(self, tokenizer, data) -> bool:
        """Whether the prompts are plain text: when the tokenizer has no chat template (a base model).
        Then `plain_text` holds data.system_prompt (or ""), for rows() to render; call before rows()."""
        self.plain_text = None if getattr(tokenizer, "chat_template", None) else data.system_prompt or ""
        return self.plain_text is not None

    def prompt_set(self, split: str, tokenizer, data, limit: int | None = None) -> PromptSet:
        """The split's prompts (its first `limit`) formatted and tokenized as a run sees them: plain text
        when the tokenizer has no chat template (use_plain_text), else data's chat template and system
        prompt; data.max_prompt_length first raised to the task's longest prompt (fit_prompt_length,
        which writes it into `data`: pass a copy to keep the caller's)."""
        plain = self.use_plain_text(tokenizer, data)
        self.fit_prompt_length(data, tokenizer)
        texts = [row["prompt"] for row in self.rows(split)][: limit or None]
        chat = data.apply_chat_template and not plain
        return tokenize_prompts(texts, tokenizer, data.max_prompt_length, chat, data.system_prompt if chat else None)

    def fit_prompt_length(self, data, tokenizer) -> None:
        """Raise data.max_prompt_length to the longest task prompt (as formatted): a task prompt cut
        from the left loses its question, or the chat template's system turn."""
        texts = [row["prompt"] for row in self.rows("train") + self.rows("eval")]
        chat = data.apply_chat_template and self.plain_text is None
        prompts = tokenize_prompts(texts, tokenizer, 10**9, chat, data.system_prompt if chat else None)
        longest = max(len(ids) for ids in prompts.input_ids)
        if longest > data.max_prompt_length:
            logger.info(
                "data.max_prompt_length raised from %d to %d tokens, the longest prompt of the task (%s): task prompts "
                "are never truncated.",
                data.max_prompt_length,
                longest,
                ", ".join(self.names),
            )
            data.max_prompt_length = longest


class Verifier:
    """One task's scores in TRL's reward-function convention, `fn(completions, task, item, **kwargs)`:
    `task` and `item` are columns of the task's rows (its name, and the item's number in `entries`).
    It scores only its own rows (None, unscored, for the others), so that each task of a mix is a
    source of its own (env/reward/<task>) and the weighted sum is, for each row, its own task's score.
    A library's verifier says how one completion scores against its entry (`score`)."""

    def __init__(self, name: str, entries: dict[int, dict]):
        self.__name__ = name  # the source's name: env/reward/<task>
        self.__qualname__ = f"{type(self).__name__}({name})"
        self.entries = entries

    def __call__(self, completions, task, item, **kwargs) -> list[float | None]:
        return [
            self.score(c, self.entries[i]) if t == self.__name__ else None for c, t, i in zip(completions, task, item)
        ]

    def score(self, completion, entry: dict) -> float:
        raise NotImplementedError(f"{type(self).__name__}.score(completion, entry)")


class TaskReward(FunctionReward):
    """A task's verifier as a reward source: a FunctionReward that comes with the data, so that
    rewards/sources.py weighs it with the task's one weight (the last of reward.reward_weights)."""
