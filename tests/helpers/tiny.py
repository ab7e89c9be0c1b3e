"""Tiny random models and a tokenizer built in code: the tests download nothing."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from hydrappo.planner.tokenizer import word_tokenizer

VOCAB = 96
HIDDEN = 32
LAYERS = 4


def tiny_config(family: str, num_layers: int = LAYERS, vocab_size: int = VOCAB, **overrides):
    common = dict(vocab_size=vocab_size, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "gpt2":
        config = GPT2Config(n_embd=HIDDEN, n_layer=num_layers, n_head=4, n_positions=128, **common)
    elif family == "gpt_neox":
        config = GPTNeoXConfig(
            hidden_size=HIDDEN,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
            rotary_pct=0.5,
            **common,
        )
    elif family == "opt":
        config = OPTConfig(
            hidden_size=HIDDEN,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            ffn_dim=64,
            max_position_embeddings=128,
            word_embed_proj_dim=HIDDEN,
            **common,
        )
    elif family == "llama":
        config = LlamaConfig(
            hidden_size=HIDDEN,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            tie_word_embeddings=True,
            **common,
        )
    elif family == "mistral":
        config = MistralConfig(
            hidden_size=HIDDEN,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            sliding_window=8,
            **common,
        )
    elif family == "qwen2":
        config = Qwen2Config(
            hidden_size=HIDDEN,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=2,
            **common,
        )
    else:
        raise ValueError(family)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


FAMILIES = ("gpt2", "gpt_neox", "opt", "llama", "mistral", "qwen2")


def first_family_quick(families=FAMILIES):
    """The families as parameters of a test whose every case takes seconds: the first runs in the
    quick loop (`pytest -m "not slow"`), the others with the whole suite."""
    import pytest

    return [families[0], *(pytest.param(family, marks=pytest.mark.slow) for family in families[1:])]


def tiny_model(family: str = "llama", seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    config = tiny_config(family, **kwargs)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


# Tests that compare two ways of computing the same numbers with a tiny model (a padded batch vs
# single rows, the cached split vs the whole pass, adapters merged vs added, an exported model vs
# the hydra) run it in float64: the two ways compute the same values with other sums. A log-prob is
# a chain of <= 10 sums of <= 1e3 terms (<= 14 positions x 64 features) of magnitude <= 10 (logits
# of a random model), off by <= 10 * 1e3 * 2**-53 * 10 ~ 1.1e-11; with a factor 10 for what later
# layers amplify, FLOAT64_ATOL = 1e-10. (In float32 the same bound is ~6e-2; a bare 1e-5 was a
# guess the machine's kernels decide.) A wrong branch, adapter, mask or position is off by ~1e-1.
FLOAT64_ATOL = 1e-10


def tiny64(family: str = "llama", seed: int = 0, **kwargs):
    """tiny_model in float64 (the initialisation drawn in float32, as tiny_model's)."""
    return tiny_model(family, seed, **kwargs).double()


WORDS = [f"w{i}" for i in range(VOCAB - 4)]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over 'w0'..'wN' (ids 4..VOCAB-1)."""
    return word_tokenizer(WORDS)


def left_padded_batch(rows: list[list[int]], pad_id: int = 0):
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return ids, mask
