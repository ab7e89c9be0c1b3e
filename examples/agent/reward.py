"""The agent example's reward, a reward function as TRL's GRPOTrainer takes it (`fn(completions,
**kwargs)`, the dataset's columns as keyword arguments). In a multi-turn episode `completions` is
the policy's final reply, its answer (the tool's result earlier in the episode does not count).

- `accuracy`: 1.0 when the last number of the answer (commas allowed: 125,619) is the `answer`
  column, else 0.0.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d[\d,]*")


def accuracy(completions, answer, **kwargs):
    scores = []
    for completion, expected in zip(completions, answer):
        numbers = NUMBER.findall(completion)
        scores.append(1.0 if numbers and numbers[-1].replace(",", "") == str(expected) else 0.0)
    return scores
