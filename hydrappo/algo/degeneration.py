"""Degenerate answers: text that ends in a loop, the over-optimisation a policy falls into when
nothing holds it near the reference (e.g. an answer followed by one emoji to the token limit).

A response is counted as degenerate when its last `window` tokens (before a final stop token)
repeat one unit of at most `max_period` tokens: "!!!!!!!!" (period 1) and an emoji that the
byte-level tokenizer writes as 3 tokens, repeated (period 3), both count. It is a cheap, text-free
check in the spirit of the repetition rates of Welleck et al. 2020 ("Neural Text Generation with
Unlikelihood Training", seq-rep-n), aimed at the tail, where RL-trained loops sit. Pure Python on
token ids: no tokenizer, no model.
"""

from __future__ import annotations

from collections.abc import Sequence

DEGENERATE_WINDOW = 8
DEGENERATE_MAX_PERIOD = 4  # one emoji is up to 4 byte-level tokens


def repeated_tail(
    token_ids: Sequence[int], window: int = DEGENERATE_WINDOW, max_period: int = DEGENERATE_MAX_PERIOD
) -> bool:
    """Whether the last `window` tokens are one unit of 1..max_period tokens repeated (the last
    repetition may be cut short). Shorter sequences are not counted."""
    if window < 2 or max_period < 1:
        raise ValueError(f"window must be >= 2 and max_period >= 1, got {window}, {max_period}")
    if len(token_ids) < window:
        return False
    tail = list(token_ids[-window:])
    return any(
        all(tail[i] == tail[i + period] for i in range(window - period))
        for period in range(1, min(max_period, window - 1) + 1)
    )


def degeneration_flags(
    response_ids: Sequence[Sequence[int]],
    ended: Sequence[bool],
    window: int = DEGENERATE_WINDOW,
    max_period: int = DEGENERATE_MAX_PERIOD,
) -> list[bool]:
    """Per response, `repeated_tail` of its tokens without the stop token that ended it
    (a response that `ended` carries its stop token last, as rollout.Responses do)."""
    if len(response_ids) != len(ended):
        raise ValueError(f"{len(response_ids)} responses but {len(ended)} ended flags")
    return [
        repeated_tail(ids[:-1] if stop and ids else ids, window, max_period) for ids, stop in zip(response_ids, ended)
    ]
