"""The degeneration metric (algo/degeneration.py) on hand-made token sequences."""

import pytest

from hydrappo.algo.degeneration import degeneration_flags, repeated_tail

POINT = [10813, 235, 227]  # "👉" in SmolLM2's byte-level tokenizer: three tokens


def test_a_tail_of_one_token_or_one_multi_token_emoji_is_degenerate():
    assert repeated_tail([1, 2, 3] + [7] * 8)
    assert repeated_tail([198, 198] + POINT * 3)  # 9 tokens: the last 8 have period 3
    assert repeated_tail([5, 6] + POINT * 2 + [10813, 235])  # the last repeat cut by the limit


def test_ordinary_text_and_short_answers_are_not():
    assert not repeated_tail([22, 216, 39, 30, 1195, 260, 18, 19])  # 8 distinct-enough tokens
    assert not repeated_tail([7] * 7)  # shorter than the window
    assert not repeated_tail([7] * 7 + [8])  # one different last token breaks period 1..4
    assert not repeated_tail([1, 2, 3, 4, 5, 1, 2, 3, 4, 5])  # period 5 > max_period 4
    assert repeated_tail([1, 2, 3, 4, 5, 1, 2, 3, 4, 5], max_period=5, window=10)


def test_flags_leave_out_the_stop_token():
    eos = 2
    rows = [[9] * 8 + [eos], [9] * 7 + [eos], [1, 2, 3, 4, 5, 6, 7, 8], [9] * 9]
    assert degeneration_flags(rows, [True, True, False, False]) == [True, False, False, True]
    # the same row counted without its stop: [9]*7 + [eos] is not a loop of 8
    assert degeneration_flags([[9] * 7 + [eos]], [False]) == [False]
    with pytest.raises(ValueError):
        degeneration_flags(rows, [True])
    with pytest.raises(ValueError):
        repeated_tail([1, 2], window=1)
