"""The harness every stage shares: exact resume for the reward and SFT stages (PPO's is in
test_ppo_trainer.py), periodic checkpoints, and checkpoints written before the stages shared it."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hydrappo.config import SFTConfig, parse_config
from hydrappo.storage.checkpoint import WEIGHTS_NAME, checkpoint_dirs
from hydrappo.train.ppo import PPOTrainer
from hydrappo.train.reward import RewardTrainer
from hydrappo.train.sft import SFTTrainer
from runs import reward_config, write_sft_config

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny"
LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "legacy"


class Killed(Exception):
    pass


def kill_during_step(trainer, monkeypatch, step: int) -> None:
    """The process dies in the middle of `step`: after it consumed random numbers and moved
    the weights in memory, before its metrics line or any checkpoint of it was written."""
    real_step = trainer.train_step

    def train_step():
        result = real_step()
        if trainer.harness.step + 1 == step:
            raise Killed
        return result

    monkeypatch.setattr(trainer, "train_step", train_step)


def same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    pairs = list(zip(a.named_parameters(), b.named_parameters()))
    assert pairs
    for (name, x), (_, y) in pairs:
        assert torch.equal(x, y), name


def test_reward_stage_killed_and_resumed_ends_with_the_same_weights(tmp_path, monkeypatch):
    # 20 batches per epoch: the kill at step 23 lands in the second epoch, after checkpoint-20.
    options = dict(epochs=2, save_every=5, lr_scheduler="cosine", warmup_steps=3, cache_split_hidden=True)
    for name in ("straight", "resumed"):
        (tmp_path / name).mkdir()
    straight = RewardTrainer(reward_config(tmp_path / "straight", **options))
    straight.train()
    assert straight.step == 40

    config = reward_config(tmp_path / "resumed", **options)
    interrupted = RewardTrainer(config)
    kill_during_step(interrupted, monkeypatch, 23)
    with pytest.raises(Killed):
        interrupted.train()
    assert [p.name for p in checkpoint_dirs(config.train.output_dir)] == ["checkpoint-15", "checkpoint-20"]

    resumed = RewardTrainer(reward_config(tmp_path / "resumed", **options))
    history = resumed.train(resume=True)
    assert history[0]["step"] == 21 and resumed.step == straight.step
    same_parameters(straight.branch, resumed.branch)
    assert resumed.score_stats == straight.score_stats
    final = json.loads((resumed.checkpoint_path / "trainer_state.json").read_text())
    assert final["score_mean"] == straight.score_stats["score_mean"]
    lines = (Path(config.train.output_dir) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, straight.step + 1))


def test_sft_stage_killed_and_resumed_ends_with_the_same_weights_and_saves_periodically(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    overrides = ["--save_every", "3", "--lr_scheduler", "linear", "--warmup_steps", "2", "--keep_last", "2"]
    straight = SFTTrainer(parse_config(write_sft_config(tmp_path / "a"), overrides, SFTConfig))
    straight.train()
    total = straight.step
    assert total == 21  # 3 epochs of 7 batches
    kept = [p.name for p in checkpoint_dirs(tmp_path / "a" / "sft")]
    assert kept == ["checkpoint-18", "checkpoint-21"]  # every 3 steps and at the end, the last two kept

    interrupted = SFTTrainer(parse_config(write_sft_config(tmp_path / "b"), overrides, SFTConfig))
    kill_during_step(interrupted, monkeypatch, 11)  # mid-epoch 2, after checkpoint-9
    with pytest.raises(Killed):
        interrupted.train()
    assert not (tmp_path / "b" / "sft" / "config.json").exists()  # the model is written at the end only
    resumed = SFTTrainer(parse_config(write_sft_config(tmp_path / "b"), overrides, SFTConfig))
    history = resumed.train(resume=True)
    assert history[0]["step"] == 10 and resumed.step == total
    same_parameters(straight.hydra, resumed.hydra)
    saved_a = load_file(str(tmp_path / "a" / "sft" / "model.safetensors"))
    saved_b = load_file(str(tmp_path / "b" / "sft" / "model.safetensors"))
    assert saved_a.keys() == saved_b.keys() and all(torch.equal(saved_a[k], saved_b[k]) for k in saved_a)


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
