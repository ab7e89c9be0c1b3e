"""A tiny PPO run with the PI KL controller: the coefficient moves, env/degenerate_frac is logged,
and a run resumed from a checkpoint ends with the controller state of the straight run."""

from pathlib import Path

import torch

from hydrappo.config import parse_config
from hydrappo.train.ppo import PPOTrainer

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny"
SMALL = ["--save_every", "2", "--batch_size", "8", "--mini_batch_size", "4", "--kl_controller", "pi",
         "--init_kl_coef", "0.05", "--kl_target", "0.5", "--no_progress_bar"]  # fmt: skip


def trainer(output_dir, steps):
    config = parse_config(TINY / "config.yaml", ["--output_dir", str(output_dir), "--total_steps", str(steps), *SMALL])
    return PPOTrainer(config, config_dir=TINY)


def test_pi_controller_runs_logs_degeneration_and_resumes_exactly(tmp_path):
    straight = trainer(tmp_path / "straight", 4)
    history = straight.train()
    coefs = [row["objective/kl_coef"] for row in history]
    assert coefs[0] == 0.05 and len(set(coefs)) == 4, coefs  # steered every step
    assert all(0.0 <= row["env/degenerate_frac"] <= 1.0 for row in history)

    trainer(tmp_path / "resumed", 2).train()
    resumed = trainer(tmp_path / "resumed", 4)
    assert [row["step"] for row in resumed.train(resume=True)] == [3, 4]
    assert resumed.kl_controller.state_dict() == straight.kl_controller.state_dict()


def test_dapo_overlong_options_run(tmp_path):
    # Every tiny response runs to the token limit: with the filter nothing reaches the loss, so
    # the update leaves the weights as they were; the penalty is -1 on each (buffer 2 of 8 tokens).
    config = parse_config(TINY / "config.yaml", ["--output_dir", str(tmp_path), "--total_steps", "1", "--batch_size", "8",
                                                 "--mini_batch_size", "4", "--no_progress_bar", "--mask_truncated",
                                                 "--overlong_buffer", "2", "--min_new_tokens", "8"])  # fmt: skip
    run = PPOTrainer(config, config_dir=TINY)
    before = {name: p.detach().clone() for name, p in run.hydra.named_parameters() if p.requires_grad}
    (row,) = run.train()
    assert row["env/missing_eos_frac"] == 1.0 and row["env/overlong_penalty_mean"] == -1.0
    for name, p in run.hydra.named_parameters():
        if name in before:
            assert torch.equal(p, before[name]), name
