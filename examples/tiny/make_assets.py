"""Writes the tiny example's model config, tokenizer and prompts (already committed;
run again only to change them): python examples/tiny/make_assets.py

The task has a known optimum: the vocabulary has 48 neutral words (n0..n47) and 8 "good"
words (g0..g7), and reward.py pays the fraction of response words that are good. A random
policy starts near 8/56 = 0.14; the best policy reaches 1.0.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
NEUTRAL = [f"n{i}" for i in range(48)]
GOOD = [f"g{i}" for i in range(8)]


def main() -> None:
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    vocab.update({word: i + 4 for i, word in enumerate(NEUTRAL + GOOD)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>", bos_token="<bos>"
    )
    # As in SmolLM2: the pad token is the EOS token.
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model_dir = HERE / "model"
    tokenizer.save_pretrained(model_dir)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    config.save_pretrained(model_dir)

    rng = random.Random(0)
    with open(HERE / "prompts.jsonl", "w") as handle:
        for _ in range(128):
            words = rng.choices(NEUTRAL, k=rng.randint(3, 6))
            handle.write(json.dumps({"prompt": " ".join(words)}) + "\n")


if __name__ == "__main__":
    main()
