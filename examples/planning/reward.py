"""The planning example's rewards and measures, reward functions as TRL's GRPOTrainer takes them
(`fn(prompts, completions, **kwargs)`, the prompt table's columns as keyword arguments). In an
episode `completions` is the policy's final reply and `transcripts` the whole episode after the
prompt (its calls, the tools' results, the answer).

Rewarded (config.yaml's reward_weights 1, 0.5, 1):
- `accuracy`: 1.0 when the last number of the final answer (commas allowed) is the sum.
- `plan`: on a 5-digit sum of k numbers, the share of its k lines the calls added in order
  (add_line(line=1), then line 2, ...); a verifiable step reward, so that an episode that gets
  the first steps of the chain right scores above one that does not even when neither reaches
  the sum. None on a one-digit sum (no plan).
- `wasted_calls`: minus the calls beyond what the question needs (any call on a one-digit sum,
  a call more than k on a 5-digit one). Without it a call on a one-digit sum would pay: the
  tool is right where the head is right 7 to 9 times in 10 (README). At weight 1, a call on a
  one-digit sum scores at most 0, below the head's answer on average.

Measured only (weight 0: logged as reward/<name> and eval/reward/<name>; None where the question
is of the other kind, so each is a mean over its kind):
- `called_when_needed`: 1.0 when an episode on a 5-digit sum wrote at least one call.
- `called_when_not_needed`: 1.0 when an episode on a one-digit sum wrote a call.
- `solved_with_tool` / `solved_in_head`: accuracy on each kind.
- `calls`: the calls an episode wrote.
"""

from __future__ import annotations

import json
import re

NUMBER = re.compile(r"-?\d[\d,]*")
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def _correct(completion: str, expected) -> bool:
    numbers = NUMBER.findall(completion)
    return bool(numbers) and numbers[-1].replace(",", "") == str(expected)


def _calls(transcript: str) -> list[dict | None]:
    """The calls written, in order: their arguments, or None for a block that is not a call."""
    calls = []
    for body in CALL.findall(transcript):
        try:
            arguments = json.loads(body)["arguments"]
            calls.append(arguments if isinstance(arguments, dict) else None)
        except (ValueError, KeyError, TypeError):
            calls.append(None)
    return calls


def accuracy(prompts, completions, answer, **kwargs):
    return [1.0 if _correct(c, a) else 0.0 for c, a in zip(completions, answer)]


def plan(prompts, completions, transcripts, needs_tool, numbers, **kwargs):
    scores = []
    for transcript, needed, listed in zip(transcripts, needs_tool, numbers):
        if not needed:
            scores.append(None)
            continue
        done = 0
        for arguments in _calls(transcript):
            if done == len(listed) or arguments != {"line": done + 1}:
                break
            done += 1
        scores.append(done / len(listed))
    return scores


def wasted_calls(prompts, completions, transcripts, calls_needed, **kwargs):
    return [-float(max(0, len(_calls(t)) - int(needed))) for t, needed in zip(transcripts, calls_needed)]


def calls(prompts, completions, transcripts, **kwargs):
    return [float(len(_calls(t))) for t in transcripts]


def called_when_needed(prompts, completions, transcripts, needs_tool, **kwargs):
    return [float(len(_calls(t)) > 0) if needed else None for t, needed in zip(transcripts, needs_tool)]


def called_when_not_needed(prompts, completions, transcripts, needs_tool, **kwargs):
    return [None if needed else float(len(_calls(t)) > 0) for t, needed in zip(transcripts, needs_tool)]


def solved_with_tool(prompts, completions, answer, needs_tool, **kwargs):
    return [float(_correct(c, a)) if needed else None for c, a, needed in zip(completions, answer, needs_tool)]


def solved_in_head(prompts, completions, answer, needs_tool, **kwargs):
    return [None if needed else float(_correct(c, a)) for c, a, needed in zip(completions, answer, needs_tool)]
