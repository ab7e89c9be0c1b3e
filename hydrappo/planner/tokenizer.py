"""A word-level tokenizer built in code, with no download: what the memory validation
(planner/validate.py) and the tests run random models of any vocabulary size with."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: <pad> <bos> <eos> <unk> are ids 0-3, `words` follow from id 4; pad
    is the EOS token and padding is on the left, as in SmolLM2."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    vocab.update({word: i + 4 for i, word in enumerate(words)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def tokenizer_for_vocab(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word_tokenizer whose ids cover a model's whole vocabulary ('w4' .. 'wN' are ids 4 .. N)."""
    return word_tokenizer([f"w{i}" for i in range(4, vocab_size)])
