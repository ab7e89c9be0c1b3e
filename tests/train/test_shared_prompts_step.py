"""ppo.share_prompts in the PPO step: the rows that share a prompt pass it once through the
trainable layers (model/shared_prompt.py), in the experience pass and the update, and the step
measures the same numbers with fewer tokens. Float64, one epoch of one minibatch, so that every
statistic of the step comes from passes before its optimizer step (the gradients' agreement is
tests/model/test_shared_prompt.py's)."""

import math
import sys

import pytest

from bounds import EXACT, SCALAR_NOISE
from runs import ROOT, tiny_trainer

sys.path.insert(0, str(ROOT / "tools" / "lab"))

import bench_shared_prompts  # noqa: E402

ONE_UPDATE = ["--batch_size", "8", "--mini_batch_size", "8", "--ppo_epochs", "1", "--max_new_tokens", "2"]


def first_step(folder, shared: bool):
    """The statistics and samples of a tiny run's first step, and the tokens its update passed
    through the first trainable layer (counted as tools/lab/bench_shared_prompts.py counts them)."""
    trainer = tiny_trainer(folder, *EXACT, *ONE_UPDATE, "--samples_per_prompt", "4", "--share_prompts", str(shared))
    step = trainer.ppo_step
    assert step.hydra.shares_prompts, step.hydra.prompt_sharing_problem
    tokens = bench_shared_prompts.count_band_tokens(step, ("ppo_update",))
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
