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
