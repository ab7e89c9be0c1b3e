"""The arithmetic example's verifiable reward: 1.0 when the LAST integer in the response
equals a + b of the question "What is {a} + {b}?", else 0.0. No bonus for format."""

from __future__ import annotations

import re

QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")
INTEGER = re.compile(r"-?\d+")


def correct(prompt: str, response: str) -> float:
    question = QUESTION.search(prompt)
    if question is None:
        raise ValueError(f"not an arithmetic question: {prompt!r}")
    numbers = INTEGER.findall(response)
    return 1.0 if numbers and int(numbers[-1]) == int(question[1]) + int(question[2]) else 0.0


def reward_fn(samples, prompts, outputs, **kwargs):
    return [correct(prompt, response) for prompt, response in zip(prompts, outputs)]


# A format term: one line that ends with the answer (an integer, then at most a full stop).
# "3 + 4 = 7" and "11 + 6 equals 17." pass; "3 + 4 = 7\n\n👉👉👉" and "7. This is the sum." do not.
ONE_LINE_ENDING_IN_A_NUMBER = re.compile(r"[^\n]*-?\d+\s*\.?")


def format_ok(response: str) -> float:
    return 1.0 if ONE_LINE_ENDING_IN_A_NUMBER.fullmatch(response.strip()) else 0.0


def format_fn(samples, prompts, outputs, **kwargs):
    """The format term alone (1.0 or 0.0), to weigh beside reward_fn."""
    return [format_ok(response) for response in outputs]


FORMAT_WEIGHT = 0.2


def reward_with_format_fn(samples, prompts, outputs, **kwargs):
    """Correctness + 0.2 x format: a right answer followed by a loop scores 1.0, a right
    one-line answer 1.2, a wrong one-line answer 0.2."""
    return [correct(p, r) + FORMAT_WEIGHT * format_ok(r) for p, r in zip(prompts, outputs)]
