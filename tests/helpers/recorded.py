"""Sampling with the split states recorded, and the two experience passes over what was sampled
(the whole pass, and the one that reuses the recorded states), for the tests that compare them."""

from __future__ import annotations

import torch

from hydrappo.config import GenerationArgs
from hydrappo.rollout import evaluate_sequences, generate_responses, pack_sequences, pack_split_hidden

from tiny import VOCAB


def prompts_of(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def sample(hydra, tokenizer, prompts, record, loop="generate", **generation):
    args = GenerationArgs(**{"max_new_tokens": 9, "generation_batch_size": 3, "temperature": 1.0, **generation})
    torch.manual_seed(1)
    return generate_responses(hydra, tokenizer, prompts, args, record_split=record, loop=loop)


def both_passes(hydra, tokenizer, prompts, loop="generate", **generation):
    """The responses (recorded while sampling with `loop`: rollout's generate or decode) and the
    two experience passes over them."""
    recorded = sample(hydra, tokenizer, prompts, True, loop, **generation)
    ids, mask, _, width = pack_sequences(recorded.prompt_ids, recorded.response_ids, tokenizer.pad_token_id)
    split = pack_split_hidden(recorded, width, ids.shape[1])
    again = evaluate_sequences(hydra, ids, mask, width, chunk_size=4)
    reused = evaluate_sequences(hydra, ids, mask, width, chunk_size=4, split_hidden=split)
    return recorded, ids, mask, again, reused
