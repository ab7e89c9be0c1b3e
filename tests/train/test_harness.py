"""The harness every stage shares: checkpoints written before the stages shared it still load
(exact resume of every loop, and periodic checkpoints, are in test_exact_resume.py)."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from hydrappo.config import parse_config
from hydrappo.storage.checkpoint import WEIGHTS_NAME
from hydrappo.train.ppo import PPOTrainer

from runs import FIXTURES, TINY

LEGACY = FIXTURES / "legacy"


def test_ppo_resumes_a_checkpoint_written_before_the_harness(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(LEGACY / "ppo-checkpoint-2", run / "checkpoint-2")
    config = parse_config(TINY / "config.yaml", ["--output_dir", str(run), "--total_steps", "3", "--no_progress_bar"])
    trainer = PPOTrainer(config)
    trainer.harness.load(run / "checkpoint-2", trainer)
    legacy = load_file(str(LEGACY / "ppo-checkpoint-2" / WEIGHTS_NAME))
    params = dict(trainer.hydra.named_parameters())
    assert all(torch.equal(params[name], tensor) for name, tensor in legacy.items())
    assert trainer.harness.step == 2 and trainer.ppo_step.sampler.state_dict()["position"] == 64

    history = PPOTrainer(config).train(resume=True)
    assert [row["step"] for row in history] == [3]


def test_ppo_scores_with_a_reward_branch_written_before_the_harness(tmp_path):
    config = parse_config(
        TINY / "config.yaml",
        [
            "--output_dir",
            str(tmp_path),
            "--total_steps",
            "1",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "8",
            "--train_lm_head",
            "false",
            "--reward_branch_path",
            str(LEGACY / "reward-checkpoint-3"),
            "--use_reward_branch",
            "true",
            "--reward_fn",
            "",
            "--score_normalization",
            "ref",
            "--no_progress_bar",
        ],
    )
    trainer = PPOTrainer(config)
    assert config.reward.score_ref_mean == pytest.approx(0.1402, abs=1e-4)  # the legacy checkpoint's statistics
    history = trainer.train()
    assert len(history) == 1 and history[0]["env/reward_mean"] == history[0]["env/reward_mean"]


def test_adamw_takes_the_fused_kernel_and_steps_as_the_loop_does():
    # torch's fused AdamW (train/optimizers.py) computes the same update as its loop of
    # elementwise operations, in another order. In float64 each of the ~10 elementwise operations of
    # a step rounds by at most 2**-53 of what it holds (|w| <= max|w|, the update <= ~lr): after 3
    # steps the weights agree within 3 * 10 * 2**-53 * (max|w| + 1). (Gradients ~N(0, 1): none
    # near 0, where eps would amplify the difference.) A wrong step is off by ~lr = 1e-3.
    from hydrappo.config import PPOArgs
    from hydrappo.train.optimizers import fused_adamw_runs, make_optimizer

    torch.manual_seed(0)
    weights = [torch.randn(64, 32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)]
    fused_params = [torch.nn.Parameter(w.clone()) for w in weights]
    loop_params = [torch.nn.Parameter(w.clone()) for w in weights]
    args = PPOArgs(learning_rate=1e-3, weight_decay=0.01)
    fused = make_optimizer(fused_params, args)
    loop = torch.optim.AdamW(
        loop_params,
        lr=1e-3,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_eps,
        weight_decay=0.01,
        foreach=False,
    )
    assert fused.defaults["fused"] and fused_adamw_runs(fused_params)
    assert not fused_adamw_runs([torch.nn.Parameter(torch.zeros(2, device="meta"))])
    for _ in range(3):
        grads = [torch.randn_like(w) for w in weights]
        for params, optimizer in ((fused_params, fused), (loop_params, loop)):
            for param, grad in zip(params, grads):
                param.grad = grad.clone()
            optimizer.step()
    bound = 3 * 10 * 2**-53 * (max(w.abs().max().item() for w in weights) + 1)
    for got, want in zip(fused_params, loop_params):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, atol=bound, rtol=0)
