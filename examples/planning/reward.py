"""The planning example's rewards and measures, reward functions as TRL's GRPOTrainer takes them
(`fn(completions, **kwargs)`, the prompt table's columns as keyword arguments). In an episode
`completions` is the policy's final reply and `transcripts` the whole episode after the prompt
(its calls, the tools' results, the answer).

Rewarded (config.yaml's reward_weights 1 and 0.05):
- `accuracy`: 1.0 when the last number of the final answer (commas allowed) is the sum.
- `calls`: minus the number of tool calls written: a call costs 0.05, so a call where the head
  can answer, or one more than the plan needs, lowers the reward; a 5-digit sum still pays far
  more with its calls than without them.

Measured only (weight 0: logged as reward/<name>, eval/reward/<name>; None where the question is
of the other kind, so each is a mean over its kind):
- `called_when_needed`: 1.0 when an episode on a 5-digit sum wrote at least one call.
- `called_when_not_needed`: 1.0 when an episode on a one-digit sum wrote a call.
- `solved_with_tool` / `solved_in_head`: accuracy on each kind.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d[\d,]*")
CALL = re.compile(r"<tool_call>")


def _correct(completion: str, expected) -> bool:
    numbers = NUMBER.findall(completion)
    return bool(numbers) and numbers[-1].replace(",", "") == str(expected)


def _calls(transcript: str) -> int:
    return len(CALL.findall(transcript))


def accuracy(completions, answer, **kwargs):
    return [1.0 if _correct(c, a) else 0.0 for c, a in zip(completions, answer)]


def calls(completions, transcripts, **kwargs):
    return [-float(_calls(t)) for t in transcripts]


def called_when_needed(completions, transcripts, needs_tool, **kwargs):
    return [float(_calls(t) > 0) if needed else None for t, needed in zip(transcripts, needs_tool)]


def called_when_not_needed(completions, transcripts, needs_tool, **kwargs):
    return [None if needed else float(_calls(t) > 0) for t, needed in zip(transcripts, needs_tool)]


def solved_with_tool(completions, answer, needs_tool, **kwargs):
    return [float(_correct(c, a)) if needed else None for c, a, needed in zip(completions, answer, needs_tool)]


def solved_in_head(completions, answer, needs_tool, **kwargs):
    return [None if needed else float(_correct(c, a)) for c, a, needed in zip(completions, answer, needs_tool)]
