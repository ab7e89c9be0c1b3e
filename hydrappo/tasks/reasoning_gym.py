"""A reasoning-gym task (or a weighted mix of tasks) as a run's prompts AND its reward.

    task = ReasoningGymTask("chain_sum", size=1000, seed=0, eval_size=100, max_terms=3)
    PPOTrainer(model=..., task=task, args=...)      # or the config's `task:` section (config/task.py)

The arguments mirror `reasoning_gym.create_dataset(name, size=, seed=, **options)`, plus
`eval_size`. The prompts are the questions with an instruction to answer between <answer> tags;
the reward is the task's own verifier (TaskVerifier, below), behind the interface every task
library implements (tasks/base.py).

The reward of a completion is the task's `score_answer(answer, entry)` on the answer that
reasoning-gym's `extract_answer` reads from it: the text of the LAST `<answer>...</answer>` pair.
A completion without the tags scores 0: the whole reply is never scored, because the library's
default scorer gives partial credit len(answer) / len(reply) to a reply that merely contains the
answer, which would pay for rambling instead of answering (docs/reasoning-tasks.md).

Held-out items never overlap training. reasoning-gym generates item i of a dataset from
Random(seed + i), so the dataset of seed s + 1 is the dataset of seed s shifted by one item: a
held-out set drawn "with another seed" would mostly repeat training items. Here every range of
seeds is its own: task k's training items come from seeds seed + 2k * SEED_STRIDE + i and its
held-out items from seed + (2k + 1) * SEED_STRIDE + j (task_size <= SEED_STRIDE), and, since
different seeds can still write the same question (a small task has few), a held-out candidate
whose question is a training question (or an earlier held-out one) is skipped.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import logging
import textwrap

from ..config.options import ConfigError
from ..config.task import DEFAULT_INSTRUCTION, TaskArgs, task_specs
from ..rewards.calls import completion_text
from .base import Task, Verifier

logger = logging.getLogger("hydrappo")

VERSION = "0.1.25"  # the reasoning-gym release these rules were read from (setup.cfg's `reasoning` extra)
INSTALL = (
    f"pip install 'hydrappo[reasoning]' (or reasoning-gym=={VERSION}); pip compiles its dependency pycosat from "
    "source, which needs a C compiler and Python's headers (apt-get install build-essential python3-dev; macOS: "
    "xcode-select --install)"
)
SEED_STRIDE = 10_000_000  # seeds between two ranges of items (module docstring); < 2**32 over ~200 tasks
COLUMNS = ("task", "answer", "item")  # a task row's columns besides the prompt (reward functions may read them)


def registry() -> dict:
    """reasoning-gym's {task name: (dataset class, config class)}, or a ConfigError saying how to install it."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as error:
        raise ConfigError(
            f"task: the reasoning-gym package cannot be imported ({error}); install it: {INSTALL}."
        ) from None
    installed = importlib.metadata.version("reasoning-gym")
    if installed != VERSION:
        logger.warning("reasoning-gym %s is installed; hydrappo was checked with %s (%s).", installed, VERSION, INSTALL)
    return DATASETS


def check_spec(name: str, options: dict, tasks: dict, where: str) -> None:
    """A ConfigError unless `name` is a reasoning-gym task and `options` are options of its config."""
    if name not in tasks:
        close = difflib.get_close_matches(name, list(tasks), n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        listed = textwrap.fill(", ".join(sorted(tasks)), 110, initial_indent="  ", subsequent_indent="  ")
        raise ConfigError(f"{where}={name!r} is not a reasoning-gym task.{hint} Its {len(tasks)} tasks:\n{listed}")
    config_cls = tasks[name][1]
    fields = {f.name: f for f in config_cls.__dataclass_fields__.values() if f.name not in ("seed", "size")}
    for key in options:
        if key in ("seed", "size"):
            raise ConfigError(
                f"{where}: {key} is the task section's own option (task.task_{key}, or {key}= in Python), "
                "not one of the task's config options; move it there."
            )
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: {name} has no option {key!r}.{hint} Its options: {option_list(fields)}.")
    try:  # the library's own checks of the values (its configs' validate())
        made = config_cls(**options)
        if callable(getattr(made, "validate", None)):
            made.validate()
    except (AssertionError, TypeError, ValueError) as error:
        raise ConfigError(
            f"{where}: reasoning-gym refused {name}'s options {options}: {error or type(error).__name__}. "
            f"Its options: {option_list(fields)}."
        ) from None


def option_list(fields: dict) -> str:
    """'min_terms=2, max_terms=6, ...': a task's options with their defaults."""
    shown = []
    for name, f in fields.items():
        default = f.default if f.default is not f.default_factory else "..."
        shown.append(f"{name}={default!r}" if not repr(default).startswith("<dataclasses") else name)
    return ", ".join(shown)


def deal(total: int, weights: list[float]) -> list[int]:
    """`total` items dealt to tasks in proportion to `weights` (largest remainders), each task at least one."""
    shares = [total * w / sum(weights) for w in weights]
    counts = [max(1, int(share)) for share in shares]
    by_remainder = sorted(range(len(weights)), key=lambda k: counts[k] - shares[k])
    for k in by_remainder[: max(0, total - sum(counts))]:
        counts[k] += 1
    return counts


class ReasoningGymTask(Task):
    """One reasoning-gym task, `ReasoningGymTask("chain_sum", size=, seed=, eval_size=, **options)`,
    or a mix, `ReasoningGymTask({"chain_sum": {"weight": 2, "config": {...}}, "basic_arithmetic": 1}, ...)`
    (a list of {name, weight, config} as reasoning-gym's composite configs write it is taken too).
    Checked when made: reasoning-gym installed, every name a task, every option one of its options."""

    columns = COLUMNS

    def __init__(
        self,
        name,
        *,
        size: int = 1000,
        seed: int = 0,
        eval_size: int = 0,
        instruction: str | None = None,
        answer_start: str | None = None,
        partial_credit: bool = True,
        **options,
    ):
        if isinstance(name, (list, tuple)):  # reasoning-gym's composite form: [{name, weight, config}]
            if not all(isinstance(entry, dict) and isinstance(entry.get("name"), str) for entry in name):
                raise ConfigError(
                    f"ReasoningGymTask: a list of tasks holds {{name, weight, config}} mappings, not {name!r}; e.g. "
                    '[{"name": "chain_sum", "weight": 2, "config": {"max_terms": 3}}].'
                )
            name = {entry["name"]: {k: v for k, v in entry.items() if k != "name"} for entry in name}
        if isinstance(name, dict) and options:
            raise ConfigError("ReasoningGymTask: give a mix's options in each task's `config`, not as keywords.")
        self.args = TaskArgs(
            task_name=name if isinstance(name, str) else None,
            tasks=name if isinstance(name, dict) else None,
            task_config=options or None,
            task_size=size,
            task_eval_size=eval_size,
            task_seed=seed,
            task_instruction=DEFAULT_INSTRUCTION if instruction is None else instruction,
            task_answer_start=answer_start or None,
            task_partial_credit=bool(partial_credit),
        )
        specs, problems = task_specs(self.args)
        if problems:
            raise ConfigError("; ".join(str(problem) for problem in problems))
        for option, value in (("size", size), ("eval_size", eval_size), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if option == "size" else 0):
                raise ConfigError(
                    f"ReasoningGymTask: {option}={value!r} must be a whole number >= {int(option == 'size')}."
                )
        if size > SEED_STRIDE:
            raise ConfigError(
                f"task.task_size={size} is above {SEED_STRIDE}, the items one range of seeds holds; lower it."
            )
        tasks = registry()
        for task_name, _, task_options in specs:
            where = "task.task_name" if self.args.task_name else f"task.tasks.{task_name}"
            check_spec(task_name, task_options, tasks, where)
        self.specs, self._tasks, self._items = specs, tasks, None
        self.plain_text = None  # None: prompts for a chat template; else the system prompt (or "") of plain text

    @classmethod
    def from_args(cls, args: TaskArgs) -> ReasoningGymTask:
        """The task a config's `task:` section describes."""
        specs, problems = task_specs(args)
        if problems:
            raise ConfigError("; ".join(str(problem) for problem in problems))
        # (task_config and tasks may be YAML text from the command line: task_specs read them)
        name = args.task_name or {name: {"weight": weight, "config": options} for name, weight, options in specs}
        options = specs[0][2] if args.task_name else {}
        return cls(
            name,
            size=args.task_size,
            seed=args.task_seed,
            eval_size=args.task_eval_size,
            instruction=args.task_instruction,
            answer_start=args.task_answer_start,
            partial_credit=args.task_partial_credit,
            **options,
        )

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.specs]

    # ------------------------------------------------------------------ the items
    def items(self) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
        """([(task name, reasoning-gym entry)] of training, the same of the held-out items), made once."""
        if self._items is None:
            self._items = self._make_items()
        return self._items

    def _dataset(self, name: str, options: dict, seed: int, size: int):
        from reasoning_gym import create_dataset

        try:
            return create_dataset(name, seed=seed, size=size, **options)
        except (AssertionError, TypeError, ValueError) as error:
            fields = {f: v for f, v in self._tasks[name][1].__dataclass_fields__.items() if f not in ("seed", "size")}
            raise ConfigError(
                f"task {name}: reasoning-gym refused the options {options}: {error or type(error).__name__}. "
                f"Its options: {option_list(fields)}."
            ) from None

    def _make_items(self):
        args = self.args
        weights = [weight for _, weight, _ in self.specs]
        train_counts = deal(args.task_size, weights)
        eval_counts = deal(args.task_eval_size, weights) if args.task_eval_size else [0] * len(weights)
        train, held_out, self.datasets = [], [], {}
        for k, (name, _, options) in enumerate(self.specs):
            dataset = self._dataset(name, options, args.task_seed + 2 * k * SEED_STRIDE, train_counts[k])
            self.datasets[name] = dataset  # its score_answer scores this task's items
            train += [(name, dataset[i]) for i in range(train_counts[k])]
        seen = {entry["question"] for _, entry in train}
        for k, (name, _, options) in enumerate(self.specs):
            if eval_counts[k]:
                held_out += self._held_out(name, options, k, eval_counts[k], seen)
        return train, held_out

    def _held_out(self, name: str, options: dict, k: int, count: int, seen: set) -> list[tuple[str, dict]]:
        """`count` items of task k from its own range of seeds whose questions are new (added to `seen`)."""
        tries = max(4 * count, count + 1000)
        dataset = self._dataset(name, options, self.args.task_seed + (2 * k + 1) * SEED_STRIDE, tries)
        found = []
        for j in range(tries):
            entry = dataset[j]
            if entry["question"] not in seen:
                seen.add(entry["question"])
                found.append((name, entry))
                if len(found) == count:
                    return found
        raise ConfigError(
            f"task {name}: only {len(found)} of {tries} held-out candidates ask a question that training does not "
            f"(task_size {self.args.task_size}); its options allow few distinct questions. Lower task_eval_size "
            f"(to at most {len(found)}) or task_size, or widen the task's options."
        )

    def prompt(self, entry: dict) -> str | list[dict]:
        """The question and the instruction; with an answer start, as TRL's conversational prompt whose
        last turn, the assistant's, is continued (prompts.py). As plain text (use_plain_text), for a
        model without a chat template: the system prompt, the question and the instruction, a paragraph
        each, then the answer start on a line of its own (without a system prompt or an answer start,
        the same text as with a chat template's input)."""
        instruction = self.args.task_instruction
        start = self.args.task_answer_start
        text = f"{entry['question']}\n\n{instruction}" if instruction else entry["question"]
        if self.plain_text is not None:  # the user turn's text, after the system prompt; the answer start below
            text = f"{self.plain_text}\n\n{text}" if self.plain_text else text
            return f"{text}\n{start}" if start else text
        return [{"role": "user", "content": text}, {"role": "assistant", "content": start}] if start else text

    def use_plain_text(self, tokenizer, data) -> bool:
        """Whether the prompts are plain text: when the tokenizer has no chat template (a base model),
        they are rendered without one (prompt), whatever data.apply_chat_template says, and this is
        logged. Call before rows(): the rows are made anew."""
        if getattr(tokenizer, "chat_template", None):
            self.plain_text = None
            return False
        if self.plain_text == (data.system_prompt or ""):  # said already (a run formats both splits)
            return True
        self.plain_text = data.system_prompt or ""
        start = self.args.task_answer_start
        parts = ["data.system_prompt"] * bool(data.system_prompt) + ["the question", "the instruction"]
        then = f", then the answer start {start!r} on a line of its own" if start else ""
        ignored = " (data.apply_chat_template does not apply)" if data.apply_chat_template else ""
        logger.warning(
            "the tokenizer has no chat template (a base model): the task's prompts are plain text%s: %s, a paragraph "
            "each%s.",
            ignored,
            ", ".join(parts),
            then,
        )
        return True

    def rows(self, split: str = "train") -> list[dict]:
        """The items as prompt-table rows, {"prompt", "task", "answer", "item"} (`item`: the item's
        number, training items first; `prompt`: text, or a message list with an answer start), e.g.
        a `train_dataset` for TRL's own GRPOTrainer."""
        train, held_out = self.items()
        first, chosen = (0, train) if split == "train" else (len(train), held_out)
        return [
            {"prompt": self.prompt(entry), "task": name, "answer": entry["answer"], "item": first + n}
            for n, (name, entry) in enumerate(chosen)
        ]

    @property
    def reward_funcs(self) -> list[TaskVerifier]:
        """One verifier per task, in TRL's convention fn(completions, task, item, **kwargs)."""
        train, held_out = self.items()
        return [
            TaskVerifier(
                name,
                self.datasets[name].score_answer,
                {i: entry for i, (task, entry) in enumerate(train + held_out) if task == name},
                self.args.task_answer_start,
                self.args.task_partial_credit,
            )
            for name in self.names
        ]


class TaskVerifier(Verifier):
    """One reasoning-gym task's verifier: its `score_answer` on the answer between the last <answer> tags."""

    def __init__(
        self,
        name: str,
        score_answer,
        entries: dict[int, dict],
        answer_start: str | None = None,
        partial_credit: bool = True,
    ):
        super().__init__(name, entries)
        self.score_answer, self.answer_start = score_answer, answer_start
        self.partial_credit = partial_credit  # False: full marks score 1, anything less 0
        self._warned = False

    def score(self, completion, entry: dict) -> float:
        from reasoning_gym.utils import extract_answer

        text = completion_text(completion)
        answer = extract_answer(text)
        if answer is None and self.answer_start and text.startswith(self.answer_start):
            # The answer start opened the tag for the model: a response that ends without closing it
            # (SmolLM2-135M ends its turn after the number) is its answer to the end.
            answer = extract_answer(f"{text}</answer>") if self.answer_start.rstrip().endswith("<answer>") else None
        if answer is None:  # no <answer> tags: nothing to score
            return 0.0
        try:
            score = float(self.score_answer(answer, entry))
            return score if self.partial_credit or score >= 1.0 else 0.0
        except Exception as error:  # the library's scorer on an answer it cannot parse: a wrong answer
            if not self._warned:
                self._warned = True
                logger.warning(
                    "reasoning-gym's %s scorer raised %s: %s on the answer %r; such answers score 0 (logged once).",
                    self.__name__,
                    type(error).__name__,
                    error,
                    answer[:80],
                )
            return 0.0
