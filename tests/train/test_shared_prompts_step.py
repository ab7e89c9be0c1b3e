"""ppo.share_prompts in the PPO step: the rows that share a prompt pass it once through the
trainable layers (model/shared_prompt.py), in the experience pass and the update, and the step
measures the same numbers with fewer tokens. Float64, one epoch of one minibatch, so that every
statistic of the step comes from passes before its optimizer step (the gradients' agreement is
tests/model/test_shared_prompt.py's)."""

import math

import pytest

from bounds import EXACT, SCALAR_NOISE
from runs import tiny_trainer

ONE_UPDATE = ["--batch_size", "8", "--mini_batch_size", "8", "--ppo_epochs", "1", "--max_new_tokens", "2"]


def first_step(folder, shared: bool):
    """The statistics and samples of a tiny run's first step, and the tokens its update passed
    through the first trainable layer."""
    trainer = tiny_trainer(folder, *EXACT, *ONE_UPDATE, "--samples_per_prompt", "4", "--share_prompts", str(shared))
    step, hydra = trainer.ppo_step, trainer.ppo_step.hydra
    assert hydra.shares_prompts, hydra.prompt_sharing_problem
    tokens, counting = [], [False]
    update = step.ppo_update

    def counted_update(*args, **kwargs):
        counting[0] = True
        try:
            return update(*args, **kwargs)
        finally:
            counting[0] = False

    def count(module, args, kwargs):
        if counting[0]:
            tokens.append((args[0] if args else kwargs["hidden_states"]).shape[:2].numel())

    step.ppo_update = counted_update
    hydra.arch.layers[hydra.split_index].register_forward_pre_hook(count, with_kwargs=True)
    stats, samples = step.run()
    return stats, samples, sum(tokens)


def test_a_step_with_shared_prompts_measures_what_it_measures_without(tmp_path):
    shared, shared_samples, shared_tokens = first_step(tmp_path / "shared", True)
    whole, whole_samples, whole_tokens = first_step(tmp_path / "whole", False)

    assert shared_samples == whole_samples  # the same answers (sampling precedes both passes)
    compared = [key for key in whole if key.split("/")[0] in ("ppo", "objective", "env") and key in shared]
    assert "ppo/loss/policy" in compared and "objective/kl" in compared
    for key in compared:
        if isinstance(whole[key], float) and math.isfinite(whole[key]):
            assert shared[key] == pytest.approx(whole[key], rel=SCALAR_NOISE, abs=SCALAR_NOISE), key
    # 2 prompts x 4 answers of <= 2 tokens after prompts of ~3: packed rows of 2 answers (the
    # attention rule, responses_per_packed_row), so each prompt passes twice instead of 4 times.
    assert shared_tokens < whole_tokens
