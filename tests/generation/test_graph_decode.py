"""The static decode step (hydrappo/generation/graph_decode.py) against hydrappo's decode loop: the same greedy
tokens and recorded split states on every architecture family, draws from the policy's own
filtered distribution, no host sync inside a token step (what lets CUDA capture it), and graphs
that follow the trainer's in-place weight updates and are dropped when a weight gets new storage.

On a CPU the step runs eagerly: the same tensor work a CUDA graph replays. Greedy comparisons
run in float64, as tests/generation/test_decode.py's do (the two loops' logits agree to rounding, far below
the gap between the two most likely tokens)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hydrappo import HydraModel
from hydrappo.config import GenerationArgs
from hydrappo.generation.decode import SamplingRule, filtered_logits
from hydrappo.generation.graph_decode import GraphDecoding, StaticDecoder, bucket_of, weights_fingerprint
from hydrappo.generation.responses import generate_responses
from hydrappo.generation.samplers import GraphSampler, build_sampler, resolve_sampler

from recorded import float64_hydra, prompts_of, stop_string_case
from tiny import VOCAB, first_family_quick, left_padded_batch, tiny_model, tiny_tokenizer

STATE_ATOL = 1e-10  # as tests/generation/test_decode.py: the same float64 computation up to the order of a few sums


def hydra64(family="llama", seed=0):
    return float64_hydra(family, seed, num_layers_unfrozen=2, eos_boost=2)  # rows end at different steps


def both(hydra, tokenizer, prompts, args, decoding=None, **options):
    """The decode loop's responses and the static step's (a fresh GraphDecoding unless given)."""
    decoding = decoding or GraphDecoding(hydra)
    loop = generate_responses(hydra, tokenizer, prompts, args, loop="decode", **options)
    static = generate_responses(hydra, tokenizer, prompts, args, loop=decoding.chunk, **options)
    return loop, static


def assert_same(loop, static, recorded=True):
    assert (static.response_ids, static.ended) == (loop.response_ids, loop.ended)
    if recorded:
        # A row stopped by a stop string may have fed its last token before the host saw the
        # string (every SYNC_EVERY steps): its state is then recorded too (the decode loop's is not).
        for mine, theirs in zip(static.split_hidden, loop.split_hidden):
            assert mine.shape[0] - theirs.shape[0] in (0, 1)
            torch.testing.assert_close(mine[: theirs.shape[0]], theirs, atol=STATE_ATOL, rtol=0)


def test_buckets_by_hand():
    assert bucket_of(1, 1) == (1, 64)
    assert bucket_of(3, 64) == (4, 64)
    assert bucket_of(32, 65) == (32, 128)
    assert bucket_of(33, 130) == (64, 192)


@pytest.mark.parametrize("family", first_family_quick())
def test_greedy_tokens_and_recorded_states_are_the_decode_loops(family):
    tokenizer = tiny_tokenizer()
    hydra = hydra64(family)
    prompts = prompts_of([3, 7, 5, 9, 4, 6, 8, 2])
    ended = []
    for options in ({}, {"min_new_tokens": 3}, {"stop_token_ids": [11, 12, 13]}):
        args = GenerationArgs(max_new_tokens=10, generation_batch_size=3, **options)  # chunks of 3, 3, 2 rows
        loop, static = both(hydra, tokenizer, prompts, args, greedy=True, record_split=True)
        assert_same(loop, static)
        ended += loop.ended
    assert any(ended) and not all(ended)  # rows that stopped and rows that ran to the limit


def test_min_new_tokens_suppresses_the_stops():
    """A case where the first stop comes early: min_new_tokens moves it, in both loops alike."""
    tokenizer = tiny_tokenizer()
    hydra = hydra64()
    prompts = prompts_of([3, 7, 5, 9, 4, 6, 8, 2])
    plain = GenerationArgs(max_new_tokens=10, generation_batch_size=8, stop_token_ids=[11, 12, 13])
    late = GenerationArgs(max_new_tokens=10, generation_batch_size=8, stop_token_ids=[11, 12, 13], min_new_tokens=4)
    free = generate_responses(hydra, tokenizer, prompts, plain, loop=GraphDecoding(hydra).chunk, greedy=True)
    loop, static = both(hydra, tokenizer, prompts, late, greedy=True)
    assert_same(loop, static, recorded=False)
    assert min(len(r) for r in free.response_ids) < 4 <= min(len(r) for r in static.response_ids)


def test_stop_strings_end_rows_as_the_decode_loop_does():
    tokenizer = tiny_tokenizer()
    hydra = hydra64(seed=1)
    prompts, args = stop_string_case(hydra, tokenizer)
    loop, static = both(hydra, tokenizer, prompts, args, greedy=True, record_split=True)
    assert any(row[-1] == tokenizer.convert_tokens_to_ids("w50") for row in loop.response_ids)
    assert_same(loop, static)


def test_a_reward_branch_gets_the_last_tokens_state():
    """With a reward branch the step feeds every row's last token once more, so its state is recorded."""
    tokenizer = tiny_tokenizer()
    hydra = hydra64("qwen2")
    hydra.attach_reward_branch(hydra.new_reward_branch())
    prompts = prompts_of([3, 7, 5, 9, 4, 6])
    args = GenerationArgs(max_new_tokens=6, generation_batch_size=6)
    loop, static = both(hydra, tokenizer, prompts, args, greedy=True, record_split=True)
    assert_same(loop, static)
    lengths = [len(r) for r in static.response_ids]
    assert min(lengths) < 6 and max(lengths) == 6, lengths
    for states, prompt, response in zip(static.split_hidden, prompts, static.response_ids):
        whole = hydra.split_hidden_states(torch.tensor([prompt + response]))[0]
        torch.testing.assert_close(states, whole, atol=STATE_ATOL, rtol=0)


def test_shared_prefill_samples_what_a_prefill_per_row_samples():
    """A sliding-window family (the window is shorter than prompt + response), G = 4 samples of
    each prompt in a chunk of 12 rows (a bucket of 16): greedy as the decode loop, and sampled
    the same with and without the shared prefill."""
    tokenizer = tiny_tokenizer()
    hydra = hydra64("mistral")
    prompts = [p for p in prompts_of([3, 6, 4]) for _ in range(4)]
    args = GenerationArgs(max_new_tokens=7, generation_batch_size=12)
    loop, static = both(hydra, tokenizer, prompts, args, greedy=True, record_split=True)
    assert_same(loop, static)
    decoding = GraphDecoding(hydra)
    torch.manual_seed(0)
    shared = generate_responses(hydra, tokenizer, prompts, args, record_split=True, loop=decoding.chunk)
    torch.manual_seed(0)
    each = generate_responses(hydra, tokenizer, prompts, args, record_split=True, loop=decoding.chunk, share=False)
    assert shared.response_ids == each.response_ids
    assert len({tuple(r) for r in shared.response_ids}) > 3  # sampled: a group's rows differ
    for a, b in zip(shared.split_hidden, each.split_hidden):
        torch.testing.assert_close(a, b, atol=STATE_ATOL, rtol=0)


@pytest.mark.parametrize("rule", [SamplingRule(temperature=0.7), SamplingRule(temperature=1.6, top_k=6, top_p=0.9)])
def test_draws_follow_the_policys_filtered_distribution(rule):
    """The second token of 4,096 samples after one prompt whose first token is forced (greedy
    from a boosted row of lm_head would change the model; a prompt that ends in the forced token
    is the same thing): counted per token against the model's filtered probabilities, every
    count within 5 standard deviations of a binomial's expectation. The draw inside the token
    step is tested, not only the prefill's. Deterministic (seeded); a wrong temperature or filter
    moves some count far outside (checked against the unfiltered distribution)."""
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny_model("llama", initializer_range=0.3).double(), num_layers_unfrozen=1)
    prompt = prompts_of([5])[0]
    draws = 4096
    decoder = StaticDecoder(hydra, draws, 64, 2, rule, [tokenizer.eos_token_id], 0, tokenizer.pad_token_id)
    ids, mask = left_padded_batch([prompt] * draws)
    torch.manual_seed(0)
    decoder.prefill(ids, mask, record_split=False)
    first = int(decoder.tokens[0, 0])
    decoder.current.fill_(first)  # every row feeds the same first token: one distribution for the step's draw
    decoder.running.fill_(True)
    decoder.lengths.fill_(1)
    decoder.run_step(record_split=False)
    counts = torch.bincount(decoder.tokens[:, 1], minlength=VOCAB).double()
    with torch.no_grad():
        logits = hydra.model(torch.tensor([prompt + [first]])).logits[0, -1]
    probs = filtered_logits(logits[None], rule).softmax(-1)[0]
    sigma = (draws * probs * (1 - probs)).sqrt()
    assert ((counts - draws * probs).abs() <= 5 * sigma + 1).all()
    assert (counts[probs == 0] == 0).all()
    assert ((draws * (logits.softmax(-1) - probs)).abs() > 5 * sigma + 1).any()  # the check has power


SYNCING_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.repeat_interleave.Tensor")


class HostReads(TorchDispatchMode):
    """Records every operation that makes the host wait for the device (a value read by Python,
    or an output whose shape depends on the data): none may run inside a captured CUDA graph."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(SYNCING_OPS):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", first_family_quick(("llama", "gpt2", "opt", "gpt_neox", "mistral", "qwen2")))
@pytest.mark.parametrize("rule", [SamplingRule(greedy=True), SamplingRule(temperature=0.7, top_k=5, top_p=0.9)])
def test_a_token_step_reads_nothing_back_to_the_host(family, rule):
    hydra = float64_hydra(family, num_layers_unfrozen=2)
    decoder = StaticDecoder(hydra, 4, 64, 10, rule, [2, 11], 3, 0)
    ids, mask = left_padded_batch(prompts_of([3, 5, 4, 6]))
    decoder.prefill(ids, mask, record_split=True)
    with HostReads() as reads:
        decoder.step(record_split=True)
    assert reads.seen == []
    with HostReads() as reads:  # the watch sees what a host read is
        decoder.finished((), None)
    assert reads.seen


def test_in_place_weight_updates_reach_the_kept_buffers_and_new_storage_drops_them():
    """The trainer's optimizers update weights in place: the buckets kept across calls (on CUDA,
    their graphs) see the new weights. A weight given new storage (a dtype change, a load into
    new tensors) changes the fingerprint, and the buckets are made again."""
    tokenizer = tiny_tokenizer()
    hydra = hydra64()
    prompts = prompts_of([3, 7, 5, 9])
    args = GenerationArgs(max_new_tokens=8, generation_batch_size=4)
    sampler = GraphSampler(hydra, tokenizer)
    before = sampler.sample(prompts, args, greedy=True)
    live = sampler.decoding.live
    fingerprint = weights_fingerprint(hydra)
    top = hydra.arch.layers[-1]
    with torch.no_grad():
        for parameter in top.parameters():  # a policy layer, as an optimizer step changes it
            parameter.mul_(-3.0)
    assert weights_fingerprint(hydra) == fingerprint
    after = sampler.sample(prompts, args, greedy=True)
    assert sampler.decoding.live is live  # the same bucket, read with the new weights
    loop = generate_responses(hydra, tokenizer, prompts, args, greedy=True, loop="decode")
    assert after.response_ids == loop.response_ids != before.response_ids
    parameter = next(top.parameters())
    parameter.data = parameter.data.clone()  # new storage: the buckets are made again
    assert weights_fingerprint(hydra) != fingerprint
    assert sampler.decoding.check_weights() and sampler.decoding.live is None
    assert sampler.sample(prompts, args, greedy=True).response_ids == loop.response_ids


def test_the_step_autocasts_without_the_weight_cache():
    """Under mixed precision a token step keeps autocast on but caches no cast weight: a captured
    graph must cast the float32 trained weights itself at every replay, not read a copy made at
    capture (freed when the autocast region ends, stale after an optimizer step)."""
    hydra = HydraModel(tiny_model("llama"), num_layers_unfrozen=1)
    decoder = StaticDecoder(hydra, 2, 64, 4, SamplingRule(greedy=True), [2], 0, 0)
    ids, mask = left_padded_batch(prompts_of([3, 5]))
    seen = []
    hook = hydra.model.register_forward_pre_hook(
        lambda *_: seen.append((torch.is_autocast_enabled("cpu"), torch.is_autocast_cache_enabled()))
    )
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            decoder.prefill(ids, mask, record_split=False)
            decoder.step(record_split=False)
    finally:
        hook.remove()
    assert seen == [(True, True), (True, False)]  # the prefill (eager, never replayed) may cache


def test_one_bucket_lives_and_grows_to_what_the_chunks_need():
    tokenizer = tiny_tokenizer()
    hydra = hydra64()
    decoding = GraphDecoding(hydra)

    def run(prompts, rows, greedy=False):
        args = GenerationArgs(max_new_tokens=6, generation_batch_size=rows)
        generate_responses(hydra, tokenizer, prompts, args, loop=decoding.chunk, greedy=greedy)
        return decoding.live

    first = run(prompts_of([3, 7, 5, 9, 4, 6, 8]), 4)  # chunks of 4 and 3 rows
    assert (first.rows, first.capacity) == (4, 64)
    assert run(prompts_of([3, 2]), 2) is first  # fits: the same buffers
    wider = run(prompts_of([3, 60]), 2)  # 60 + 6 positions: a longer bucket, as many rows as before
    assert (wider.rows, wider.capacity) == (4, 128)
    greedy = run(prompts_of([3, 2]), 2, greedy=True)  # another rule: a bucket of its own, the old one dropped
    assert (greedy.rows, greedy.capacity) == (2, 64) and decoding.live is greedy


def test_the_sampler_is_chosen_by_name_and_auto_picks_it_on_cuda():
    tokenizer = tiny_tokenizer()
    hydra = hydra64()
    assert isinstance(build_sampler(GenerationArgs(sampler="graph"), hydra, tokenizer), GraphSampler)
    assert resolve_sampler("auto", "cpu") == "decode"  # the CPU keeps the decode loop
    assert resolve_sampler("auto", "cuda") == "graph"  # measured fastest on an H100 (DEFAULT_SAMPLER)
    assert resolve_sampler("auto", "cuda", synced=True) == "generate"  # only generate runs in lockstep
    assert (
        resolve_sampler("auto", "cuda", quantized=True) == "generate"
    )  # bitsandbytes' kernels: not measured in a graph
    assert resolve_sampler("graph", "cuda", quantized=True) == "graph"  # named: as named
