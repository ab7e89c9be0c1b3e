"""A reasoning-gym task's own verifier as a reward source (tasks/reasoning_gym.py makes the items).

The reward of a completion is the task's `score_answer(answer, entry)` on the answer that
reasoning-gym's `extract_answer` reads from it: the text of the LAST `<answer>...</answer>` pair.
A completion without the tags scores 0: the whole reply is never scored, because the library's
default scorer gives partial credit len(answer) / len(reply) to a reply that merely contains the
answer, which would pay for rambling instead of answering (docs/reasoning-tasks.md).

Each task of a mix is a source of its own, so that its mean is logged as env/reward/<task> and
eval/reward/<task>; it scores only its own rows (None, unscored, for the others), so the weighted
sum of the sources is, for each row, its own task's score.
"""

from __future__ import annotations

import logging

from .functions import FunctionReward

logger = logging.getLogger("hydrappo")


def completion_text(completion) -> str:
    """A completion as text: TRL's conversational completions are [{"role": "assistant", "content": text}]."""
    if isinstance(completion, list):
        return "".join(turn.get("content") or "" for turn in completion if isinstance(turn, dict))
    return completion


class TaskVerifier:
    """One task's scores in TRL's reward-function convention, `fn(completions, task, item, **kwargs)`:
    `task` and `item` are columns of the task's rows (its name, and the item's number in `entries`)."""

    def __init__(
        self,
        name: str,
        score_answer,
        entries: dict[int, dict],
        answer_start: str | None = None,
        partial_credit: bool = True,
    ):
        self.__name__ = name  # the source's name: env/reward/<task>
        self.__qualname__ = f"TaskVerifier({name})"
        self.score_answer, self.entries, self.answer_start = score_answer, entries, answer_start
        self.partial_credit = partial_credit  # False: full marks score 1, anything less 0
        self._warned = False

    def __call__(self, completions, task, item, **kwargs) -> list[float | None]:
        return [
            self.score(c, self.entries[i]) if t == self.__name__ else None for c, t, i in zip(completions, task, item)
        ]

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


class TaskReward(FunctionReward):
    """A task verifier as a reward source: a FunctionReward of kind "task", which
    rewards/sources.py weighs with the task's one weight (the last of reward.reward_weights)."""

    kind = "task"
