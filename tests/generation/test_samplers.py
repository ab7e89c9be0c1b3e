"""The sampler interface (hydrappo/generation/samplers.py): transformers' generate and its
continuous batching behind one `sample`, chosen by generation.sampler and built once by the
trainer.

Greedy responses are compared with the model in float64: the two samplers compute the same
logits through different attention kernels (a padded batch with an SDPA mask against a packed
paged cache), whose results differ by rounding; in float64 that rounding (~1e-16 relative) is
far below the gap between the two most likely tokens of a random tiny model (checked below),
so the argmax, hence every greedy token, is the same. Sampled responses are not compared: the
two draw their random numbers in different orders (continuous batching samples the rows it
has in each step), so only their form is checked."""

import pytest
import torch

from hydrappo import HydraModel
from hydrappo.config import ConfigError, GenerationArgs, parse_config
from hydrappo.generation.samplers import (
    ContinuousBatchingSampler,
    DecodeSampler,
    GenerateSampler,
    Sampler,
    build_sampler,
    resolve_sampler,
)

from recorded import float64_hydra, prompts_of, stop_string_case
from runs import TINY, tiny_trainer
from tiny import VOCAB, tiny_model, tiny_tokenizer


def test_both_samplers_give_the_same_greedy_responses():
    tokenizer = tiny_tokenizer()
    hydra = float64_hydra(eos_boost=2)  # some rows end early, others run to the limit
    prompts = prompts_of([3, 7, 5, 9, 4, 6, 8, 2])
    args = GenerationArgs(max_new_tokens=10, generation_batch_size=3, stop_token_ids=[11])
    plain = GenerateSampler(hydra, tokenizer).sample(prompts, args, greedy=True)
    paged = ContinuousBatchingSampler(hydra, tokenizer, page_size=4).sample(prompts, args, greedy=True)
    assert paged.response_ids == plain.response_ids
    assert paged.ended == plain.ended
    assert paged.prompt_ids == plain.prompt_ids == prompts
    assert paged.split_hidden is None
    # The comparison means something: rows of different lengths, some ended, tokens that vary.
    assert any(plain.ended) and not all(plain.ended)
    assert len({token for row in plain.response_ids for token in row}) > 5

    # The argmax is far from a tie at every greedy step, so float64 rounding cannot flip it.
    ids = [p + r for p, r in zip(prompts, plain.response_ids)]
    for row, prompt in zip(ids, prompts):
        with torch.no_grad():
            logits = hydra.model(torch.tensor([row])).logits[0, len(prompt) - 1 : -1]
        top2 = logits.topk(2, dim=-1).values
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-9


def test_continuous_batching_trims_at_stop_strings_as_generate_does():
    tokenizer = tiny_tokenizer()
    hydra = float64_hydra(seed=1)
    prompts, args = stop_string_case(hydra, tokenizer)
    plain = GenerateSampler(hydra, tokenizer).sample(prompts, args, greedy=True)
    paged = ContinuousBatchingSampler(hydra, tokenizer).sample(prompts, args, greedy=True)
    assert any(plain.ended) and not all(plain.ended)
    assert (paged.response_ids, paged.ended) == (plain.response_ids, plain.ended)


def test_sampled_responses_have_the_form_of_generates():
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny_model("llama"), num_layers_unfrozen=1)
    prompts = prompts_of([3, 5, 4, 6])
    args = GenerationArgs(max_new_tokens=6, temperature=1.0)
    torch.manual_seed(0)
    first = ContinuousBatchingSampler(hydra, tokenizer).sample(prompts, args)
    torch.manual_seed(0)
    again = ContinuousBatchingSampler(hydra, tokenizer).sample(prompts, args)
    assert again.response_ids == first.response_ids  # seeded from torch's generator: reproducible
    eos = tokenizer.eos_token_id
    for tokens, ended in zip(first.response_ids, first.ended):
        assert 1 <= len(tokens) <= 6 and all(0 <= t < VOCAB for t in tokens)
        assert ended == (tokens[-1] == eos) and eos not in tokens[:-1]
    with pytest.raises(ValueError, match="records no split states"):
        ContinuousBatchingSampler(hydra, tokenizer).sample(prompts, args, record_split=True)


def test_build_sampler_follows_the_option_and_auto_is_decode_on_cpu():
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny_model("llama"), num_layers_unfrozen=1)
    assert resolve_sampler("auto", "cpu") == "decode"
    assert resolve_sampler("auto", "cpu", synced=True) == "generate"  # only generate runs in lockstep
    built = {
        name: build_sampler(GenerationArgs(sampler=name), hydra, tokenizer)
        for name in ("auto", "decode", "generate", "continuous_batching")
    }
    assert [type(s) for s in built.values()] == [
        DecodeSampler,
        DecodeSampler,
        GenerateSampler,
        ContinuousBatchingSampler,
    ]
    assert all(isinstance(s, Sampler) for s in built.values())
    assert built["decode"].records_split and built["generate"].records_split
    assert not built["continuous_batching"].records_split
    assert type(build_sampler(GenerationArgs(), hydra, tokenizer, synced=True)) is GenerateSampler


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["decode", "graph", "generate", "continuous_batching"])
def test_the_trainer_runs_a_step_with_each_sampler(tmp_path, sampler):
    trainer = tiny_trainer(tmp_path, "--total_steps", "1", "--save_every", "0", "--sampler", sampler)
    assert trainer.ppo_step.rollout_sampler.name == sampler
    # decode, graph and generate record the split states; continuous batching leaves the trunk pass to the experience pass.
    assert trainer.ppo_step.records_split == (sampler != "continuous_batching")
    history = trainer.train()
    assert len(history) == 1 and history[0]["tokens/responses_len_mean"] > 0


def test_config_refuses_what_continuous_batching_cannot_do():
    with pytest.raises(ConfigError) as error:
        parse_config(
            TINY / "config.yaml",
            [
                "--sampler",
                "continuous_batching",
                "--min_new_tokens",
                "2",
                "--fsdp_trunk",
                "true",
                "--output_dir",
                "/tmp/unused",
            ],
        )
    message = str(error.value)
    assert "generation.min_new_tokens=2 has no continuous-batching version" in message
    assert "generation.sampler='continuous_batching' cannot run a trunk sharded" in message
    for sampler in ("decode", "graph"):
        with pytest.raises(ConfigError) as error:
            parse_config(
                TINY / "config.yaml", ["--sampler", sampler, "--fsdp_trunk", "true", "--output_dir", "/tmp/unused"]
            )
        assert f"generation.sampler={sampler!r} cannot run a trunk sharded" in str(error.value)
    with pytest.raises(
        ConfigError,
        match="generation.sampler='sglang' is not one of: auto, decode, graph, generate, continuous_batching, vllm",
    ):
        parse_config(TINY / "config.yaml", ["--sampler", "sglang", "--output_dir", "/tmp/unused"])
