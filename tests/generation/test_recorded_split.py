"""The experience pass on split hidden states recorded while sampling (generation.reuse_trunk_pass)
equals today's whole-trunk pass: log-probs, reference log-probs, values, entropy and reward
scores within float64 noise, on every architecture family, with padding, stops and chunks."""

from __future__ import annotations

import pytest
import torch

from hydrappo import HydraModel
from hydrappo.model.split import last_token_index

from recorded import both_passes, prompts_of, sample
from runs import tiny_trainer
from tiny import FAMILIES, tiny_model, tiny_tokenizer

# The models run in float64: the two passes differ only in the order of their sums (attention
# over a KV cache vs the whole sequence at once). An output is a chain of <= 8 sums (4 layers of
# attention and MLP, plus the head) of <= 1e3 terms (<= 17 positions x 64 features) of magnitude
# <= 10; a sum of n such terms is off by at most n * 2**-53 * 10, so the chain by <= 8 * 1e3 *
# 2**-53 * 10 ~ 9e-12, and with a factor 10 for what later layers amplify, ATOL = 1e-10
# (measured: <= 9e-16). The same bound in float32 would be 5e-2, and measured float32
# differences (~1e-6) depend on the machine's kernels. A real error (a state from the wrong
# position, a wrong mask) moves outputs by ~1e-1.
ATOL = 1e-10


def tiny64(family: str = "llama"):
    return tiny_model(family).double()


def assert_same_experience(again, reused, mask):
    """Equal everywhere with a reward branch. Without one, the last sampled token's state is
    not recorded (nothing reads it), so the comparison covers what PPO reads: every response
    token's log-prob, reference log-prob and entropy, the value before each response token,
    and the split states of all real tokens but the last."""
    strict = again.scores is not None
    width = again.logprobs.shape[1]
    lengths = (mask[:, -width:].sum(-1)).tolist() if not strict else None
    used = (
        torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        if not strict
        else torch.ones_like(again.logprobs, dtype=torch.bool)
    )
    for name in ("logprobs", "ref_logprobs", "values", "entropy", "scores"):
        a, b = getattr(again, name), getattr(reused, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype == torch.float64, name
            if name != "scores":
                a, b = a[used], b[used]
            torch.testing.assert_close(b, a, atol=ATOL, rtol=0, msg=name)
    real = mask.bool().clone()
    if not strict:
        real[torch.arange(len(real)), last_token_index(mask)] = False
    torch.testing.assert_close(reused.split_hidden[real], again.split_hidden[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("loop", ["generate", "decode"])
@pytest.mark.parametrize("family", FAMILIES)
def test_recorded_split_gives_the_whole_pass_outputs(family, loop):
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny64(family), 2)
    branch = hydra.new_reward_branch()
    hydra.attach_reward_branch(branch)
    # Prompts of different lengths in chunks of 3 (each chunk left-padded to its own width),
    # EOS allowed: rows stop at different lengths, some at the limit.
    prompts = prompts_of([3, 7, 5, 2, 6, 4, 8])
    recorded, ids, mask, again, reused = both_passes(
        hydra, tokenizer, prompts, loop, stop_token_ids=[5, 6, 7, 8, 9, 10]
    )
    lengths = [len(r) for r in recorded.response_ids]
    assert min(lengths) < 9 and max(lengths) == 9, lengths  # both kinds of rows are covered
    assert_same_experience(again, reused, mask)


@pytest.mark.parametrize("loop", ["generate", "decode"])
@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("num_layers_unfrozen", [0, 1, 3])
def test_split_positions_and_pooling(num_layers_unfrozen, pooling, loop):
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny64("llama"), num_layers_unfrozen)
    if num_layers_unfrozen:
        branch = hydra.new_reward_branch()
        branch.pooling = pooling
        hydra.attach_reward_branch(branch)
    prompts = prompts_of([4, 9, 1, 6, 3], seed=2)
    _, _, mask, again, reused = both_passes(
        hydra, tokenizer, prompts, loop, stop_token_ids=[11, 12, 13], max_new_tokens=7
    )
    assert_same_experience(again, reused, mask)


@pytest.mark.parametrize("loop", ["generate", "decode"])
def test_recording_does_not_change_what_is_sampled(loop):
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny64("qwen2"), 2)
    hydra.attach_reward_branch(hydra.new_reward_branch())  # every token's state recorded
    prompts = prompts_of([5, 2, 7, 3])
    plain = sample(hydra, tokenizer, prompts, False, loop, stop_token_ids=[5, 6, 7])
    recorded = sample(hydra, tokenizer, prompts, True, loop, stop_token_ids=[5, 6, 7])
    assert plain.split_hidden is None
    assert recorded.response_ids == plain.response_ids and recorded.ended == plain.ended
    for states, prompt, response in zip(recorded.split_hidden, prompts, recorded.response_ids):
        assert states.shape == (len(prompt) + len(response), hydra.arch.hidden_size)


@pytest.mark.parametrize("loop", ["generate", "decode"])
def test_a_response_of_one_token_and_all_rows_at_the_limit(loop):
    """min_new_tokens = max_new_tokens: every row needs the extra pass for its last token."""
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny64("llama"), 2)
    for new_tokens in (1, 5):
        prompts = prompts_of([3, 6, 2])
        recorded, _, mask, again, reused = both_passes(
            hydra, tokenizer, prompts, loop, max_new_tokens=new_tokens, min_new_tokens=new_tokens
        )
        assert all(len(r) == new_tokens for r in recorded.response_ids)
        assert_same_experience(again, reused, mask)


def test_trainer_records_only_where_a_frozen_split_exists(tmp_path):
    def trainer(*extra):
        return tiny_trainer(tmp_path / str(len(extra)), *extra)

    assert trainer().ppo_step.records_split
    assert not trainer("--reuse_trunk_pass", "false").ppo_step.records_split
    assert not trainer("--num_layers_unfrozen", "-1").ppo_step.records_split


@pytest.mark.slow
def test_one_ppo_step_is_the_same_with_and_without_reuse(tmp_path):
    """A whole step in float64 with AdamW's eps 1e-6: rollouts identical, every logged scalar and
    the updated weights equal within float64 noise. The two passes differ only in the order of
    float64 sums (a few 1e-16 relative); AdamW turns a gradient error dg into a weight error of
    at most lr * dg / eps per step, so over the 16 steps of lr 3e-3 (examples/tiny) weights agree
    within 16 * 3e-3 * (1e4 * 2**-53 * 10 / 1e-6) ~ 5e-6 and scalars to a relative 1e-6; clip
    fractions exactly unless a ratio lies within ~1e-7 of the clip edge. A real difference (a
    state from the wrong position) moves weights by ~lr per step and scalars by percents."""
    results = []
    for reuse in ("true", "false"):
        trainer = tiny_trainer(
            tmp_path / reuse,
            "--reuse_trunk_pass",
            reuse,
            "--total_steps",
            "1",
            "--save_every",
            "0",
            "--dtype",
            "float64",
            "--adam_eps",
            "1e-6",
        )
        stats, samples = trainer.train_step()
        weights = [p.detach().clone() for p in trainer.hydra.trainable_parameters()]
        results.append((stats, samples, weights))
    (stats_a, samples_a, weights_a), (stats_b, samples_b, weights_b) = results
    assert [s["response"] for s in samples_a] == [s["response"] for s in samples_b]
    for key, value in stats_a.items():
        if not key.startswith("time/"):
            assert value == pytest.approx(stats_b[key], abs=1e-12, rel=1e-6), key
    for a, b in zip(weights_a, weights_b):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, atol=16 * 3e-3 * (1e4 * 2**-53 * 10 / 1e-6), rtol=0)


def test_lora_on_the_top_layers_records_the_untouched_bottom():
    from peft import LoraConfig

    tokenizer = tiny_tokenizer()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    hydra = HydraModel(tiny64("llama"), 2, lora=lora)
    assert hydra.has_frozen_split
    _, _, mask, again, reused = both_passes(hydra, tokenizer, prompts_of([3, 7, 5, 2]), stop_token_ids=[5, 6, 7])
    assert_same_experience(again, reused, mask)
    assert not HydraModel(tiny64("llama"), 2, lora=lora, lora_layers="all").has_frozen_split


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_groups_share_one_prefill(family):
    """G = 3 samples per prompt, chunks of 4 rows (a group split over two chunks): the shared
    prefill samples what a prefill per row samples, and its recorded states still give the
    whole pass's outputs."""
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny64(family), 2)
    hydra.attach_reward_branch(hydra.new_reward_branch())
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


def test_shared_prefill_runs_each_distinct_prompt_once():
    from hydrappo.data import left_pad
    from hydrappo.generation.responses import shared_prefill

    hydra = HydraModel(tiny64("llama"), 2)
    chunk = [[5, 6, 7], [5, 6, 7], [8, 9], [8, 9], [8, 9], [5, 6, 7]]
    ids, mask = left_pad(chunk, 0)
    seen = []
    handle = hydra.arch.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    try:
        shared = shared_prefill(hydra, chunk, ids, mask, record_split=True)
    finally:
        handle.remove()
    assert seen == [3]  # runs of equal rows: [5 6 7] x2, [8 9] x3, [5 6 7] x1
    assert shared.cache.get_seq_length() == ids.shape[1] - 1
    assert shared.split_hidden.shape[:2] == (6, ids.shape[1] - 1)
    torch.testing.assert_close(shared.split_hidden[0], shared.split_hidden[1])
    torch.testing.assert_close(shared.split_hidden[0], shared.split_hidden[5])
    assert shared_prefill(hydra, [[5, 6], [7, 8]], *left_pad([[5, 6], [7, 8]], 0), record_split=False) is None


def test_the_last_token_pass_runs_only_for_a_reward_branch(monkeypatch):
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny64("llama"), 2)
    calls = []
    real = hydra.split_of_next_token
    monkeypatch.setattr(hydra, "split_of_next_token", lambda *args: calls.append(1) or real(*args))
    prompts = prompts_of([3, 6, 2])
    both_passes(hydra, tokenizer, prompts, max_new_tokens=4, min_new_tokens=4, generation_batch_size=3)
    assert calls == []
    hydra.attach_reward_branch(hydra.new_reward_branch())
    _, _, mask, again, reused = both_passes(
        hydra, tokenizer, prompts, max_new_tokens=4, min_new_tokens=4, generation_batch_size=3
    )
    assert calls == [1]
    assert_same_experience(again, reused, mask)
