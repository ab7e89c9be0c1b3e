"""Sampling with the split states recorded, and the two experience passes over what was sampled
(the whole pass, and the one that reuses the recorded states), for the tests that compare them."""

from __future__ import annotations

import torch

from hydrappo import HydraModel
from hydrappo.config import GenerationArgs
from hydrappo.generation.responses import generate_responses
from hydrappo.data import pack_sequences
from hydrappo.train.sequences import experience_pass, pack_split_hidden

from tiny import VOCAB, tiny64, tiny_tokenizer


def prompts_of(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def float64_hydra(family="llama", seed=0, num_layers_unfrozen=1, eos_boost=1.0, **options):
    """A tiny HydraModel in float64, with wide initial weights (initializer_range 0.2) so that
    greedy tokens vary. `eos_boost` scales EOS's row of lm_head: EOS likely enough that some rows
    end early and others run to the limit."""
    hydra = HydraModel(tiny64(family, seed, initializer_range=0.2), num_layers_unfrozen, **options)
    if eos_boost != 1.0:
        with torch.no_grad():
            hydra.model.lm_head.weight[tiny_tokenizer().eos_token_id] *= eos_boost
    return hydra


def stop_string_case(hydra, tokenizer):
    """Prompts and generation args whose greedy rows, some of them, write the stop string 'w50'
    (its row of lm_head scaled up) and end there."""
    with torch.no_grad():
        hydra.model.lm_head.weight[tokenizer.convert_tokens_to_ids("w50")] *= 4
    args = GenerationArgs(max_new_tokens=8, stop_strings=["w50"], generation_batch_size=6)
    return prompts_of([3, 5, 4, 6, 2, 7], seed=3), args


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
    again = experience_pass(hydra, ids, mask, width, chunk_size=4)
    reused = experience_pass(hydra, ids, mask, width, chunk_size=4, split_hidden=split)
    return recorded, ids, mask, again, reused
