"""The harness every stage shares: checkpoints written before the stages shared it still load
(exact resume of every loop, and periodic checkpoints, are in test_exact_resume.py)."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hydrappo.config import parse_config
from hydrappo.storage.checkpoint import WEIGHTS_NAME
from hydrappo.train.ppo import PPOTrainer

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny"
LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "legacy"


def test_ppo_resumes_a_checkpoint_written_before_the_harness(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(LEGACY / "ppo-checkpoint-2", run / "checkpoint-2")
    config = parse_config(TINY / "config.yaml", ["--output_dir", str(run), "--total_steps", "3", "--no_progress_bar"])
    trainer = PPOTrainer(config)
    trainer.harness.load(run / "checkpoint-2", trainer)
    legacy = load_file(str(LEGACY / "ppo-checkpoint-2" / WEIGHTS_NAME))
    params = dict(trainer.hydra.named_parameters())
    assert all(torch.equal(params[name], tensor) for name, tensor in legacy.items())
    assert trainer.harness.step == 2 and trainer.sampler.state_dict()["position"] == 64

    history = PPOTrainer(config).train(resume=True)
    assert [row["step"] for row in history] == [3]


def test_ppo_scores_with_a_reward_branch_written_before_the_harness(tmp_path):
    config = parse_config(TINY / "config.yaml", [
        "--output_dir", str(tmp_path), "--total_steps", "1", "--batch_size", "8", "--mini_batch_size", "8",
        "--train_lm_head", "false", "--reward_branch_path", str(LEGACY / "reward-checkpoint-3"),
        "--use_reward_branch", "true", "--reward_fn", "", "--score_normalization", "ref", "--no_progress_bar",
    ])
    trainer = PPOTrainer(config)
    assert config.reward.score_ref_mean == pytest.approx(0.1402, abs=1e-4)  # the legacy checkpoint's statistics
    history = trainer.train()
    assert len(history) == 1 and history[0]["env/reward_mean"] == history[0]["env/reward_mean"]
