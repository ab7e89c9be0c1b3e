"""The arithmetic example's rewards, written as reward functions for TRL's GRPOTrainer are
(`fn(completions, **kwargs)`, the dataset's columns as keyword arguments): hydrappo calls them
unchanged. The reference sum comes from the `answer` column of the prompt files.

- `accuracy`: 1.0 when the LAST integer of the completion is the answer, else 0.0.
- `format_reward`: 1.0 for one line that ends with a number (then at most a full stop), else
  0.0. "3 + 4 = 7" and "11 + 6 equals 17." pass; "3 + 4 = 7\\n\\n👉👉👉" and
  "7. This is the sum." do not. config.yaml weighs it 0.2 beside accuracy: a right answer
  that runs on into a loop then scores 1.0, a right one-line answer 1.2.
"""

from __future__ import annotations

import re

INTEGER = re.compile(r"-?\d+")
ONE_LINE_ENDING_IN_A_NUMBER = re.compile(r"[^\n]*-?\d+\s*\.?")


def is_correct(completion: str, answer) -> bool:
    numbers = INTEGER.findall(completion)
    return bool(numbers) and int(numbers[-1]) == int(answer)


def format_ok(completion: str) -> bool:
    return ONE_LINE_ENDING_IN_A_NUMBER.fullmatch(completion.strip()) is not None


def accuracy(completions, answer, **kwargs):
    return [1.0 if is_correct(c, a) else 0.0 for c, a in zip(completions, answer)]


def format_reward(completions, **kwargs):
    return [1.0 if format_ok(c) else 0.0 for c in completions]
