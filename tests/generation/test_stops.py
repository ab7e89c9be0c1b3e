"""generation/stops.py's first_stop: the binary search over prefix lengths finds the same stop as
decoding every growing prefix, with about log2(R) + 1 decodes per row instead of R."""

import math
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from hydrappo.generation.stops import first_stop

from tiny import tiny_tokenizer


def linear_first_stop(tokens, stop_ids, stop_strings, tokenizer):
    """The definition: scan the tokens in order, decoding every prefix."""
    for index, token in enumerate(tokens):
        if token in stop_ids:
            return index + 1, True
        if stop_strings:
            text = tokenizer.decode(tokens[: index + 1], skip_special_tokens=False)
            if any(stop in text for stop in stop_strings):
                return index + 1, True
    return len(tokens), False


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE (as GPT-2, Llama 3, SmolLM2), trained here on text with multi-byte characters."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    text = [
        "The answer is 42.\n###\nCafé déjà vu, naïve façade. 日本語のテキスト。 END",
        "x = 1 + 2; y = 3 * 4\n###",
    ] * 20
    backend.train_from_iterator(
        text,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


class CountingTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer, self.decodes = tokenizer, 0

    def decode(self, *args, **kwargs):
        self.decodes += 1
        return self.tokenizer.decode(*args, **kwargs)


@pytest.mark.parametrize("kind", ["word-level", "byte-level"])
def test_the_search_finds_the_first_stop_of_every_row(kind):
    tokenizer = tiny_tokenizer() if kind == "word-level" else byte_level_tokenizer()
    eos = tokenizer.eos_token_id
    if kind == "word-level":
        stop_sets = [[], ["w50"], ["w7 w8", "w31"], ["w1"]]
        vocabulary = list(range(4, 60))
    else:
        stop_sets = [[], ["###"], ["\n", "END"], ["é"], ["語の"], ["= 3"]]
        vocabulary = [i for i in range(len(tokenizer)) if i != eos]
    rng = random.Random(0)
    stopped = 0
    for _ in range(300):
        length = rng.randint(0, 40)
        row = [rng.choice(vocabulary) for _ in range(length)]
        if row and rng.random() < 0.4:
            row[rng.randrange(len(row))] = eos  # a stop token before, after or without a stop string
        stop_strings = rng.choice(stop_sets)
        expected = linear_first_stop(row, {eos}, stop_strings, tokenizer)
        assert first_stop(row, {eos}, stop_strings, tokenizer) == expected, (row, stop_strings)
        stopped += expected[1]
    assert stopped > 50  # the rows exercise stops, not only the no-stop path


def test_a_stop_string_on_the_stop_tokens_own_text_is_not_a_stop_string_stop():
    tokenizer = tiny_tokenizer()
    eos = tokenizer.eos_token_id
    row = [5, 6, eos, 7]
    assert (
        first_stop(row, {eos}, ["<eos>"], tokenizer) == (3, True) == linear_first_stop(row, {eos}, ["<eos>"], tokenizer)
    )


@pytest.mark.parametrize("length", [1, 2, 64, 500])
def test_decodes_per_row_are_logarithmic(length):
    tokenizer = CountingTokenizer(tiny_tokenizer())
    stop = tokenizer.tokenizer.convert_tokens_to_ids("w50")
    for position in (0, length // 3, length - 1, None):  # a stop string early, in the middle, last, or none
        row = [5] * length
        if position is not None:
            row[position] = stop
        tokenizer.decodes = 0
        assert first_stop(row, set(), ["w50"], tokenizer) == (
            (position + 1, True) if position is not None else (length, False)
        )
        assert tokenizer.decodes <= math.ceil(math.log2(length)) + 1
