"""hydrappo's decode loop (hydrappo/generation/decode.py) against transformers' generate: the same
greedy tokens and recorded split states on every architecture family, draws from the policy's own
(filtered) distribution, and rows that end leave the batch.

Greedy comparisons run the tiny models in float64: the loop and generate run the same modules
on the same inputs, so their logits agree to rounding (~1e-15), far below the gap between the
two most likely tokens of these random models (tests/generation/test_samplers.py checks that gap);
every argmax, hence every token, is the same."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hydrappo import HydraModel
from hydrappo.config import GenerationArgs
from hydrappo.generation.decode import PreallocatedLayer, SamplingRule, filtered_logits, sample_from_probs, with_room
from hydrappo.generation.responses import generate_responses

from recorded import float64_hydra, prompts_of, stop_string_case
from tiny import FAMILIES, VOCAB, first_family_quick, tiny_model, tiny_tokenizer

# States of the two loops: the same float64 computation up to the order of a few sums (see
# tests/generation/test_recorded_split.py for the bound); measured <= 5e-15.
STATE_ATOL = 1e-10


def hydra64(family="llama", seed=0):
    return float64_hydra(family, seed, num_layers_unfrozen=2, eos_boost=2)  # rows end at different steps


def test_inverse_cdf_sampling_by_hand():
    probs = torch.tensor([[0.25, 0.0, 0.5, 0.25]] * 6)  # binary fractions: the sums are exact
    uniforms = torch.tensor([0.0, 0.2, 0.25, 0.7, 0.75, 0.999])
    # cumulative 0.25, 0.25, 0.75, 1.0: index 0 below 0.25, the zero-probability index 1 never, 2 below 0.75
    assert sample_from_probs(probs, uniforms).tolist() == [0, 0, 2, 2, 3, 3]
    # Rows that do not sum to one are scaled by their total; a uniform that rounds up to the total
    # still picks the last entry that has mass, never a trailing zero.
    unnormalised = torch.tensor([[2.0, 2.0, 0.0], [1.0, 3.0, 0.0]])
    assert sample_from_probs(unnormalised, torch.tensor([0.49, 0.26])).tolist() == [0, 1]
    assert sample_from_probs(unnormalised, torch.tensor([1.0, 1.0])).tolist() == [1, 1]


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.8), (7, 0.6), (200, 0.999)])
def test_the_filters_are_transformers_warpers(top_k, top_p):
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    rule = SamplingRule(temperature=0.7, top_k=top_k, top_p=top_p)
    expected = TemperatureLogitsWarper(0.7)(None, logits)
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(filtered_logits(logits, rule), expected)
    if top_k or top_p < 1.0:
        assert torch.isinf(expected).any()  # the case filters something


@pytest.mark.parametrize("family", first_family_quick())
def test_greedy_tokens_and_recorded_states_are_generates(family):
    tokenizer = tiny_tokenizer()
    hydra = hydra64(family)
    prompts = prompts_of([3, 7, 5, 9, 4, 6, 8, 2])
    ended = []
    for options in ({}, {"min_new_tokens": 3}, {"stop_token_ids": [11, 12, 13]}):
        args = GenerationArgs(max_new_tokens=10, generation_batch_size=3, **options)
        plain = generate_responses(hydra, tokenizer, prompts, args, greedy=True, record_split=True, loop="generate")
        own = generate_responses(hydra, tokenizer, prompts, args, greedy=True, record_split=True, loop="decode")
        assert (own.response_ids, own.ended) == (plain.response_ids, plain.ended), options
        ended += plain.ended
        for mine, theirs, prompt, response in zip(own.split_hidden, plain.split_hidden, prompts, own.response_ids):
            # The loop records every token it feeds back: the prompt and all response tokens but the last.
            assert mine.shape[0] == len(prompt) + len(response) - 1
            torch.testing.assert_close(mine, theirs[: mine.shape[0]], atol=STATE_ATOL, rtol=0)
    assert any(ended) and not all(ended)  # rows that stopped and rows that ran to the limit


def test_stop_strings_end_rows_as_generate_does():
    tokenizer = tiny_tokenizer()
    hydra = hydra64(seed=1)
    prompts, args = stop_string_case(hydra, tokenizer)
    plain = generate_responses(hydra, tokenizer, prompts, args, greedy=True, loop="generate")
    own = generate_responses(hydra, tokenizer, prompts, args, greedy=True, loop="decode")
    assert any(row[-1] == tokenizer.convert_tokens_to_ids("w50") for row in plain.response_ids)
    assert (own.response_ids, own.ended) == (plain.response_ids, plain.ended)


def test_a_reward_branch_gets_the_last_tokens_state():
    """With a reward branch the loop feeds every row's last token once more, so its state is
    recorded: for the rows that ended early and for the rows at the limit."""
    tokenizer = tiny_tokenizer()
    hydra = hydra64("qwen2")
    hydra.attach_reward_branch(hydra.new_reward_branch())
    prompts = prompts_of([3, 7, 5, 9, 4, 6])
    args = GenerationArgs(max_new_tokens=6, generation_batch_size=6)
    own = generate_responses(hydra, tokenizer, prompts, args, greedy=True, record_split=True, loop="decode")
    lengths = [len(r) for r in own.response_ids]
    assert min(lengths) < 6 and max(lengths) == 6, lengths
    for states, prompt, response in zip(own.split_hidden, prompts, own.response_ids):
        whole = hydra.split_hidden_states(torch.tensor([prompt + response]))[0]
        torch.testing.assert_close(states, whole, atol=STATE_ATOL, rtol=0)


def test_shared_prefill_samples_what_a_prefill_per_row_samples():
    tokenizer = tiny_tokenizer()
    hydra = hydra64("mistral")
    prompts = [p for p in prompts_of([3, 6, 4]) for _ in range(4)]  # G = 4 samples of each
    args = GenerationArgs(max_new_tokens=7, generation_batch_size=12)
    torch.manual_seed(0)
    shared = generate_responses(hydra, tokenizer, prompts, args, record_split=True, loop="decode")
    torch.manual_seed(0)
    each = generate_responses(hydra, tokenizer, prompts, args, record_split=True, loop="decode", share=False)
    assert shared.response_ids == each.response_ids
    assert len({tuple(r) for r in shared.response_ids}) > 3  # sampled: a group's rows differ
    for a, b in zip(shared.split_hidden, each.split_hidden):
        torch.testing.assert_close(a, b, atol=STATE_ATOL, rtol=0)


@pytest.mark.parametrize("rule", [SamplingRule(temperature=0.7), SamplingRule(temperature=1.6, top_k=6, top_p=0.9)])
def test_draws_follow_the_policys_filtered_distribution(rule):
    """The first token of 20,000 samples of one prompt, counted per token, against the model's
    probabilities (softmax of the filtered logits): every count within 5 standard deviations of
    its expectation (a binomial's). The seed is fixed, so the test is deterministic; a wrong
    temperature or filter moves some count far outside (checked: the distributions differ)."""
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny_model("llama", initializer_range=0.3).double(), num_layers_unfrozen=1)
    prompt = prompts_of([5])[0]
    draws = 20000
    args = GenerationArgs(
        max_new_tokens=1, generation_batch_size=draws, temperature=rule.temperature, top_k=rule.top_k, top_p=rule.top_p
    )
    torch.manual_seed(0)
    sampled = generate_responses(hydra, tokenizer, [prompt] * draws, args, loop="decode").response_ids
    counts = torch.bincount(torch.tensor([row[0] for row in sampled]), minlength=VOCAB).double()
    with torch.no_grad():
        logits = hydra.model(torch.tensor([prompt])).logits[0, -1]
    probs = filtered_logits(logits[None], rule).softmax(-1)[0]
    sigma = (draws * probs * (1 - probs)).sqrt()
    assert ((counts - draws * probs).abs() <= 5 * sigma + 1).all()
    assert (counts[probs == 0] == 0).all()
    # The check has power: the unfiltered distribution, and the filtered one at temperature 1, are far from this one.
    for other in (logits.softmax(-1), filtered_logits(logits[None], replace(rule, temperature=1.0)).softmax(-1)[0]):
        assert ((draws * (other - probs)).abs() > 5 * sigma + 1).any()


def test_rows_that_ended_leave_the_batch():
    """Batch sizes the model sees, step by step: rows that ended are dropped once a quarter of the
    batch is done, while generate decodes every row to the end."""
    tokenizer = tiny_tokenizer()
    hydra = hydra64()
    seen = []
    handle = hydra.model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    prompts = prompts_of([3, 7, 5, 9, 4, 6, 8, 2])
    args = GenerationArgs(max_new_tokens=10, generation_batch_size=8, stop_token_ids=[11, 12, 13])
    try:
        own = generate_responses(hydra, tokenizer, prompts, args, greedy=True, loop="decode")
        loop_sizes, seen[:] = list(seen), []
        generate_responses(hydra, tokenizer, prompts, args, greedy=True, loop="generate")
    finally:
        handle.remove()
    assert set(seen) == {8}  # generate: every step runs all 8 rows
    assert loop_sizes[0] == 8 and min(loop_sizes) < 8 and loop_sizes == sorted(loop_sizes, reverse=True)
    assert sum(loop_sizes) < sum(seen)
    # No step ran more rows than were still running, plus those ended since the last compaction.
    lengths = sorted(len(r) for r in own.response_ids)
    assert len(loop_sizes) == max(lengths)
    assert all(size >= sum(n > step for n in lengths) for step, size in enumerate(loop_sizes))
    assert math.isclose(sum(n for n in lengths), sum(len(r) for r in own.response_ids))


@pytest.mark.parametrize("family", FAMILIES[:1])
def test_seeded_sampling_is_reproducible(family):
    tokenizer = tiny_tokenizer()
    hydra = hydra64(family)
    prompts = prompts_of([3, 5, 4, 6])
    args = GenerationArgs(max_new_tokens=6, temperature=0.9)
    torch.manual_seed(3)
    first = generate_responses(hydra, tokenizer, prompts, args, loop="decode")
    torch.manual_seed(3)
    again = generate_responses(hydra, tokenizer, prompts, args, loop="decode")
    assert (first.response_ids, first.ended) == (again.response_ids, again.ended)


def test_the_preallocated_cache_layer_holds_what_a_dynamic_layer_holds():
    from transformers.cache_utils import DynamicLayer

    generator = torch.Generator().manual_seed(0)
    room, plain = PreallocatedLayer(capacity=4), DynamicLayer()
    for width in (3, 1, 1, 5, 1):  # past its capacity twice: it grows
        keys, values = (torch.randn(4, 2, width, 8, generator=generator) for _ in range(2))
        got, expected = room.update(keys, values), plain.update(keys, values)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert room.get_seq_length() == plain.get_seq_length() == 11
    for layer in (room, plain):
        layer.batch_select_indices(torch.tensor([3, 0]))
    keys, values = (torch.randn(2, 2, 1, 8, generator=generator) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(room.update(keys, values), plain.update(keys, values)))


def test_the_loop_runs_on_preallocated_layers():
    """Full-attention layers become PreallocatedLayers; sliding-window ones keep their kind."""
    for family, expected in (
        ("llama", {"PreallocatedLayer"}),
        ("qwen2", {"PreallocatedLayer", "DynamicSlidingWindowLayer"}),
    ):
        model = tiny_model(family)
        cache = with_room(None, model, capacity=16)
        assert {type(layer).__name__ for layer in cache.layers} == expected, family


@pytest.mark.parametrize("family", first_family_quick(("llama", "gpt2", "gpt_neox", "opt", "mistral")))
def test_a_carried_cache_is_extended_as_the_whole_context_would_be_prefilled(family):
    """A second turn fed from where each row's first-turn cache ends (generate_responses(carried=))
    samples what a prefill of the whole context samples, with the same split states: rows whose
    contexts grow by different lengths, one without a cache, one whose context left its cache's
    tokens midway (only the common start is reused), chunks of 3 rows. A model with sliding-window
    layers (mistral's tiny config) keeps no cache: its turns prefill again, with the same results."""
    hydra, tokenizer = hydra64(family), tiny_tokenizer()
    args = GenerationArgs(max_new_tokens=5, generation_batch_size=3)
    prompts = prompts_of([4, 6, 3, 5, 7], seed=2)
    first = generate_responses(
        hydra, tokenizer, prompts, args, record_split=True, greedy=True, loop="decode", carried=[None] * 5
    )
    sliding = family == "mistral"
    assert all(c is None if sliding else len(c.ids) >= len(p) for c, p in zip(first.caches, prompts))
    more = prompts_of([1, 4, 2, 3, 6], seed=5)
    contexts = [p + r + m for p, r, m in zip(prompts, first.response_ids, more)]
    contexts[3] = contexts[3][:6] + [7] + contexts[3][7:]  # within its cached tokens: the cache is reused up to there
    carried = list(first.caches)
    carried[1] = None  # its whole context is fed
    fed: list[int] = []
    hook = hydra.model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].numel()), with_kwargs=True)
    try:
        extended = generate_responses(
            hydra, tokenizer, contexts, args, record_split=True, greedy=True, loop="decode", carried=carried
        )
        fed_extending, fed[:] = sum(fed), []
        again = generate_responses(hydra, tokenizer, contexts, args, record_split=True, greedy=True, loop="decode")
        fed_again = sum(fed)
    finally:
        hook.remove()
    assert extended.response_ids == again.response_ids and extended.ended == again.ended
    for mine, theirs in zip(extended.split_hidden, again.split_hidden):
        assert mine.shape == theirs.shape and torch.allclose(mine, theirs, rtol=0, atol=STATE_ATOL)
    if sliding:
        assert fed_extending == fed_again and extended.caches == [None] * 5
    else:  # the same tokens sampled, fewer fed: the carried part was not fed again
        assert fed_extending < fed_again
        assert [c.ids[: len(ctx)] == ctx[: len(c.ids)] for c, ctx in zip(extended.caches, contexts)] == [True] * 5


def test_only_the_decode_loop_carries_a_cache():
    hydra, tokenizer = hydra64(), tiny_tokenizer()
    with pytest.raises(ValueError, match="only the decode loop"):
        generate_responses(
            hydra, tokenizer, [[5, 6]], GenerationArgs(max_new_tokens=2), loop="generate", carried=[None]
        )
