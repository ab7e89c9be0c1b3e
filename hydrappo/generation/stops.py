"""Where a sampled response ends: at its first stop token id or stop string.

A row is trimmed at its first stop after sampling, whichever sampler drew it (first_stop), and
transformers' `generate` is told to end a row at a stop string while sampling (StopOnStrings).
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteria


class StopOnStrings(StoppingCriteria):
    """Ends a row once its generated text contains a stop string.

    transformers' own `stop_strings` needs a vocabulary it can map to strings token by
    token, which word-level and some SentencePiece tokenizers defeat; decoding the
    generated part works with any tokenizer and agrees exactly with `first_stop`."""

    def __init__(self, stop_strings: list[str], tokenizer, prompt_width: int):
        self.stop_strings = list(stop_strings)
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_width :], skip_special_tokens=False)
        done = [any(stop in text for stop in self.stop_strings) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def first_stop(tokens: list[int], stop_ids: set[int], stop_strings: list[str], tokenizer) -> tuple[int, bool]:
    """Length of a generated response up to and including its first stop, and whether it stopped.

    A stop token id ends the response at that token; a stop string ends it at the token that
    completes it (as generate does), if that comes first. The stop string is found by a binary
    search over prefix lengths: about log2(R) + 1 decodes of a row of R tokens instead of R
    (decoding every growing prefix cost O(R^2) per row). The search returns the shortest prefix
    whose text contains a stop string because that property only switches on as the prefix
    grows: decoding a longer prefix extends the text of a shorter one. Where a tokenizer's
    decoding is not prefix-stable (a prefix ending inside a multi-byte character decodes to a
    replacement character), the result is still a prefix that ends exactly where a stop string
    is completed.
    """
    stop_at = next((index + 1 for index, token in enumerate(tokens) if token in stop_ids), None)
    # A stop string must be complete before the stop token (the stop token's own text is not searched).
    searchable = len(tokens) if stop_at is None else stop_at - 1
    if stop_strings and searchable > 0:

        def has_stop(length: int) -> bool:
            text = tokenizer.decode(tokens[:length], skip_special_tokens=False)
            return any(stop in text for stop in stop_strings)

        if has_stop(searchable):
            low, high = 1, searchable  # the shortest prefix with a stop string lies in [low, high]
            while low < high:
                middle = (low + high) // 2
                if has_stop(middle):
                    high = middle
                else:
                    low = middle + 1
            return low, True
    if stop_at is not None:
        return stop_at, True
    return len(tokens), False
