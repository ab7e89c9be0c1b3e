"""A band of trainable layers (model.trainable_layers) while sampling: the states recorded at the
band's bottom (both sampling loops, the shared prefill) give the whole pass's experience, and the
experience pass on them never runs the layers below the band. Float64 within ATOL, the bound
test_recorded_split.py derives (assert_same_experience)."""

from __future__ import annotations

import pytest
import torch

from hydrappo import HydraModel
from hydrappo.data import pack_sequences
from hydrappo.train.sequences import experience_pass, pack_split_hidden

from recorded import both_passes, prompts_of, sample
from runs import tiny_trainer
from test_recorded_split import assert_same_experience
from tiny import FAMILIES, tiny64, tiny_tokenizer


def band_hydra(family="llama"):
    hydra = HydraModel(tiny64(family), trainable_layers="1:3")  # frozen 0 | band 1, 2 | frozen 3
    hydra.attach_reward_branch(hydra.new_reward_branch())  # every token's state is read: the strict comparison
    return hydra


@pytest.mark.parametrize("loop", ["generate", "decode"])
@pytest.mark.parametrize("family", FAMILIES)
def test_states_recorded_at_the_bands_bottom_give_the_whole_pass(family, loop):
    hydra = band_hydra(family)
    with torch.no_grad():  # a trained band: policy and reference differ
        for p in hydra.arch.layers[2].parameters():
            p.mul_(1.1)
    prompts = prompts_of([3, 7, 5, 2, 6, 4, 8])
    recorded, ids, mask, again, reused = both_passes(
        hydra, tiny_tokenizer(), prompts, loop, stop_token_ids=[5, 6, 7, 8, 9]
    )
    assert recorded.split_hidden[0].shape[-1] == hydra.arch.hidden_size
    assert (again.logprobs - again.ref_logprobs).abs().max() > 1e-3
    assert_same_experience(again, reused, mask)


def test_the_experience_pass_on_recorded_states_never_runs_the_layers_below_the_band():
    hydra = band_hydra()
    calls = {"below": 0, "above": 0}
    handles = [
        hydra.arch.layers[0].register_forward_pre_hook(lambda *a: calls.__setitem__("below", calls["below"] + 1)),
        hydra.arch.layers[3].register_forward_pre_hook(lambda *a: calls.__setitem__("above", calls["above"] + 1)),
    ]
    tokenizer = tiny_tokenizer()
    recorded = sample(hydra, tokenizer, prompts_of([3, 5, 4]), True)
    ids, mask, _, width = pack_sequences(recorded.prompt_ids, recorded.response_ids, tokenizer.pad_token_id)
    split = pack_split_hidden(recorded, width, ids.shape[1])
    calls.update(below=0, above=0)
    try:
        experience_pass(hydra, ids, mask, width, chunk_size=4, split_hidden=split)
    finally:
        for handle in handles:
            handle.remove()
    # Below: nothing (its SkipLayer stands in). Above: the policy's and the reference's paths.
    assert calls == {"below": 0, "above": 2}


def test_groups_sharing_one_prefill_record_the_bands_states():
    hydra = band_hydra("qwen2")
    tokenizer = tiny_tokenizer()
    prompts = [p for p in prompts_of([3, 7, 1, 5]) for _ in range(3)]
    per_row = sample(
        hydra, tokenizer, prompts, False, share_prompt_prefill=False, generation_batch_size=4, stop_token_ids=[5, 6]
    )
    shared = sample(
        hydra, tokenizer, prompts, False, share_prompt_prefill=True, generation_batch_size=4, stop_token_ids=[5, 6]
    )
    assert shared.response_ids == per_row.response_ids
    _, _, mask, again, reused = both_passes(hydra, tokenizer, prompts, generation_batch_size=4, stop_token_ids=[5, 6])
    assert_same_experience(again, reused, mask)


def test_a_band_trainer_records_the_split(tmp_path):
    trainer = tiny_trainer(tmp_path, "--trainable_layers", "1:3")
    assert trainer.ppo_step.records_split and trainer.hydra.split_index == 1 and trainer.hydra.is_band
