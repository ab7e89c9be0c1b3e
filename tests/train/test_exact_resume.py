"""Exact resume, one shape for every loop: a run killed part-way and resumed ends with the weights
(and the state that steers training) of the same run left uninterrupted, bit for bit, on the CPU.

Each case names how to build its trainer in a folder, how the first run dies, where the resumed
run starts, and what else must match. Resume across processes (tests/train/test_distributed.py)
and after `kill -9` in a checkpoint write (tests/cli/test_cli_errors.py) run real processes and
stay where they are."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hydrappo.config import SFTConfig, parse_config
from hydrappo.storage.checkpoint import CheckpointError, checkpoint_dirs
from hydrappo.train.reward_model import RewardTrainer
from hydrappo.train.sft import SFTTrainer
from runs import (
    TINY,
    VERIFIABLE,
    Killed,
    kill_after_next_save,
    kill_during_step,
    reward_config,
    tiny_trainer,
    write_dpo_config,
    write_sft_config,
)

try:
    import bitsandbytes  # noqa: F401

    HAS_BNB = True
except ImportError:
    HAS_BNB = False


@dataclass
class Case:
    make: Callable[[Path], object]  # a trainer whose run lives in this folder
    kill: Callable[[object, pytest.MonkeyPatch], None]  # arranges for the first run to die
    resumed_steps: list[int]  # the steps the resumed run trains (its history's steps, or the first of them)
    weights: str = "hydra"  # the trainer's module whose parameters must match
    dies_with: type = Killed
    resume_from: Callable[[Path], object] = lambda folder: True  # train(resume=...)
    after_kill: Callable[[Path], None] = lambda folder: None  # checks, or damage, after the death
    check: Callable[[object, object, Path], None] = lambda straight, resumed, folder: None
    history_prefix_only: bool = False  # the stages' histories are compared on their first step


# ------------------------------------------------------------------------------------------ PPO
# Four steps of 8 rollouts in minibatches of 4, a checkpoint after step 2: most runs below build on it.
FOUR_STEPS = ["--total_steps", "4", "--save_every", "2", "--batch_size", "8", "--mini_batch_size", "4"]
PPO = [
    *FOUR_STEPS,
    "--gradient_accumulation_steps",
    "2",
    "--lr_scheduler",
    "cosine",
    "--warmup_steps",
    "2",
    "--kl_controller",
    "adaptive",
    "--score_normalization",
    "running",
]


def ppo_dead_line(folder: Path) -> None:
    # Killed during step 3, after checkpoint-2: a metrics line of the dead step must not survive.
    with (folder / "out" / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 3, "env/reward_mean": 0.0}) + "\n")


def ppo_check(straight, resumed, folder: Path) -> None:
    assert straight.ppo_step.kl_controller.value == resumed.ppo_step.kl_controller.value
    assert straight.ppo_step.score_moments.state_dict() == resumed.ppo_step.score_moments.state_dict()
    lines = (folder / "out" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]
    # The dead run's line was moved aside, not lost.
    side_files = list((folder / "out").glob("metrics.after-step-2.*.jsonl"))
    assert len(side_files) == 1 and json.loads(side_files[0].read_text())["env/reward_mean"] == 0.0


# The warm-up is counted by the step, which the checkpoint holds: a run killed in step 2 of a
# 3-step warm-up resumes into the warm-up.
WARMUP = [
    "--total_steps",
    "4",
    "--save_every",
    "1",
    "--batch_size",
    "8",
    "--mini_batch_size",
    "4",
    "--critic_warmup_steps",
    "3",
    "--lr_scheduler",
    "linear",
]


def warmup_check(straight, resumed, folder: Path) -> None:
    assert [row.get("ppo/critic_warmup", 0.0) for row in straight.history] == [1.0, 1.0, 1.0, 0.0]
    assert [(row["step"], row.get("ppo/critic_warmup", 0.0)) for row in resumed.history] == [
        (2, 1.0),
        (3, 1.0),
        (4, 0.0),
    ]


GROUPS = [
    "--reward_fn",
    VERIFIABLE,
    "--samples_per_prompt",
    "4",
    "--advantage_estimator",
    "rloo",
    "--total_steps",
    "4",
    "--save_every",
    "2",
    "--batch_size",
    "16",
    "--mini_batch_size",
    "8",
    "--kl_penalty",
    "loss",
    "--init_kl_coef",
    "0.02",
]


def interrupt_in_step_3(trainer, monkeypatch) -> None:
    real_update = trainer.ppo_step.ppo_update

    def die_in_step_3(experience, plan):
        if trainer.harness.step == 2:
            raise KeyboardInterrupt
        return real_update(experience, plan)

    monkeypatch.setattr(trainer.ppo_step, "ppo_update", die_in_step_3)


QUANTIZED = [*FOUR_STEPS, "--ppo_epochs", "2", "--trunk_quantization", "int8", "--optimizer", "adamw8bit"]


def quantized_check(straight, resumed, folder: Path) -> None:
    state = torch.load(checkpoint_dirs(folder.parent / "straight" / "out")[-1] / "training_state.pt", weights_only=True)
    moments = [values["__bnb_optimizer_quant_state__"] for values in state["optimizer"]["state"].values()]
    assert any(values["state1"].dtype == torch.uint8 for values in moments)  # 8-bit state, not float32
    switched = tiny_trainer(folder / "out", *QUANTIZED[:-2], "--total_steps", "6")  # optimizer: adamw
    with pytest.raises(CheckpointError, match="ppo.optimizer: 'adamw8bit' in the checkpoint, 'adamw' now"):
        switched.train(resume=True)


# The PI controller's state (its integral and last error) resumes with the run.
PI = [*FOUR_STEPS, "--kl_controller", "pi", "--init_kl_coef", "0.05", "--kl_target", "0.5"]


def pi_check(straight, resumed, folder: Path) -> None:
    coefs = [row["objective/kl_coef"] for row in straight.history]
    assert coefs[0] == 0.05 and len(set(coefs)) == 4, coefs  # steered every step
    assert all(0.0 <= row["env/degenerate_frac"] <= 1.0 for row in straight.history)
    assert resumed.ppo_step.kl_controller.state_dict() == straight.ppo_step.kl_controller.state_dict()


# Held-out evaluation with sampled answers (they draw random numbers) at every step: the resumed
# run's metrics are the straight run's, and the step-0 baseline is not repeated.
HELD_OUT = [*FOUR_STEPS, "--ppo_epochs", "1", "--eval_every", "1", "--eval_greedy", "false"]


def held_out_trainer(folder: Path):
    folder.mkdir(exist_ok=True)
    held_out = folder / "held_out.jsonl"  # 12 of the tiny example's prompts
    held_out.write_text("".join((TINY / "prompts.jsonl").read_text().splitlines(keepends=True)[-12:]))
    return tiny_trainer(folder / "out", *HELD_OUT, "--eval_prompts", str(held_out))


def held_out_check(straight, resumed, folder: Path) -> None:
    def metrics(run: Path) -> list[dict]:
        rows = [json.loads(line) for line in (run / "out" / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]

    assert [row["step"] for row in metrics(folder)] == [0, 1, 2, 3, 4]
    assert metrics(folder.parent / "straight") == metrics(folder)


# LoRA adapters on the top layers, resumed from an explicitly named checkpoint.
LORA = [
    "--total_steps",
    "2",
    "--save_every",
    "1",
    "--batch_size",
    "8",
    "--mini_batch_size",
    "4",
    "--lora_r",
    "4",
    "--train_lm_head",
    "false",
]


# -------------------------------------------------------------------- the supervised stages
# 20 batches per epoch: the kill at step 23 lands in the second epoch, after checkpoint-20.
REWARD = dict(epochs=2, save_every=5, lr_scheduler="cosine", warmup_steps=3, cache_split_hidden=True)


def reward_trainer(folder: Path) -> RewardTrainer:
    folder.mkdir(exist_ok=True)
    return RewardTrainer(reward_config(folder, **REWARD))


def reward_after_kill(folder: Path) -> None:
    assert [p.name for p in checkpoint_dirs(folder / "reward")] == ["checkpoint-15", "checkpoint-20"]


def reward_check(straight, resumed, folder: Path) -> None:
    assert straight.step == 40 and resumed.step == straight.step
    assert resumed.score_stats == straight.score_stats
    final = json.loads((resumed.checkpoint_path / "trainer_state.json").read_text())
    assert final["score_mean"] == straight.score_stats["score_mean"]
    lines = (folder / "reward" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, straight.step + 1))


SFT = ["--save_every", "3", "--lr_scheduler", "linear", "--warmup_steps", "2", "--keep_last", "2"]


def sft_trainer(folder: Path) -> SFTTrainer:
    folder.mkdir(exist_ok=True)
    return SFTTrainer(parse_config(write_sft_config(folder), SFT, SFTConfig))


def sft_after_kill(folder: Path) -> None:
    assert not (folder / "sft" / "config.json").exists()  # the model is written at the end only


def sft_check(straight, resumed, folder: Path) -> None:
    assert straight.step == 21 and resumed.step == straight.step  # 3 epochs of 7 batches
    # Every 3 steps and at the end, the last two kept.
    assert [p.name for p in checkpoint_dirs(folder.parent / "straight" / "sft")] == ["checkpoint-18", "checkpoint-21"]
    saved_a = load_file(str(folder.parent / "straight" / "sft" / "model.safetensors"))
    saved_b = load_file(str(folder / "sft" / "model.safetensors"))
    assert saved_a.keys() == saved_b.keys() and all(torch.equal(saved_a[k], saved_b[k]) for k in saved_a)


def dpo_trainer(folder: Path):
    from hydrappo.config import DPOConfig
    from hydrappo.train.dpo import DPOTrainer

    folder.mkdir(exist_ok=True)
    return DPOTrainer(parse_config(write_dpo_config(folder, save_every=3), [], DPOConfig))


def dpo_check(straight, resumed, folder: Path) -> None:
    assert straight.step == straight.total_steps == resumed.step > 11  # past the step the first run died in
    saved_a = load_file(str(folder.parent / "straight" / "dpo" / "model.safetensors"))
    saved_b = load_file(str(folder / "dpo" / "model.safetensors"))
    assert saved_a.keys() == saved_b.keys() and all(torch.equal(saved_a[k], saved_b[k]) for k in saved_a)


def ppo_case(options, **kwargs) -> Case:
    return Case(make=lambda folder: tiny_trainer(folder / "out", *options), **kwargs)


CASES = {
    "ppo": ppo_case(PPO, kill=kill_after_next_save, resumed_steps=[3, 4], after_kill=ppo_dead_line, check=ppo_check),
    "ppo_critic_warmup": ppo_case(WARMUP, kill=kill_after_next_save, resumed_steps=[2, 3, 4], check=warmup_check),
    "critic_free_groups": ppo_case(GROUPS, kill=interrupt_in_step_3, resumed_steps=[3, 4], dies_with=KeyboardInterrupt),
    "quantized_int8_adamw8bit": ppo_case(
        QUANTIZED, kill=kill_after_next_save, resumed_steps=[3, 4], check=quantized_check
    ),
    "kl_pi_controller": ppo_case(PI, kill=kill_after_next_save, resumed_steps=[3, 4], check=pi_check),
    # A band of trainable layers (1:3 of 4) with LoRA on it, the reference its layers with adapters off.
    "band_lora": ppo_case([*LORA, "--trainable_layers", "1:3"], kill=kill_after_next_save, resumed_steps=[2]),
    "band": ppo_case(
        [*PI, "--trainable_layers", "1:3"], kill=kill_after_next_save, resumed_steps=[3, 4], check=pi_check
    ),
    "held_out_eval": Case(make=held_out_trainer, kill=kill_after_next_save, resumed_steps=[3, 4], check=held_out_check),
    "lora": ppo_case(
        LORA, kill=kill_after_next_save, resumed_steps=[2], resume_from=lambda folder: folder / "out" / "checkpoint-1"
    ),
    "reward_stage": Case(
        make=reward_trainer,
        kill=lambda trainer, monkeypatch: kill_during_step(trainer, monkeypatch, 23),
        resumed_steps=[21],
        weights="branch",
        history_prefix_only=True,
        after_kill=reward_after_kill,
        check=reward_check,
    ),
    "sft_stage": Case(  # killed mid-epoch 2, after checkpoint-9
        make=sft_trainer,
        kill=lambda trainer, monkeypatch: kill_during_step(trainer, monkeypatch, 11),
        resumed_steps=[10],
        history_prefix_only=True,
        after_kill=sft_after_kill,
        check=sft_check,
    ),
    "dpo_stage": Case(  # killed at step 11, after checkpoint-9
        make=dpo_trainer,
        kill=lambda trainer, monkeypatch: kill_during_step(trainer, monkeypatch, 11),
        resumed_steps=[10],
        history_prefix_only=True,
        check=dpo_check,
    ),
}
PARAMS = [
    pytest.param(
        name,
        marks=[pytest.mark.skipif(not HAS_BNB, reason="pip install 'hydrappo[quant]'")] if "quantized" in name else [],
        id=name,
    )
    for name in CASES
]


@pytest.mark.slow
@pytest.mark.parametrize("name", PARAMS)
def test_a_killed_and_resumed_run_ends_with_the_weights_of_the_uninterrupted_one(name, tmp_path, monkeypatch):
    case = CASES[name]
    straight = case.make(tmp_path / "straight")
    straight.history = straight.train()

    folder = tmp_path / "resumed"
    interrupted = case.make(folder)
    case.kill(interrupted, monkeypatch)
    with pytest.raises(case.dies_with):
        interrupted.train()
    case.after_kill(folder)

    resumed = case.make(folder)
    resumed.history = resumed.train(resume=case.resume_from(folder))
    steps = [row["step"] for row in resumed.history]
    assert (steps[:1] if case.history_prefix_only else steps) == case.resumed_steps

    pairs = list(
        zip(getattr(straight, case.weights).named_parameters(), getattr(resumed, case.weights).named_parameters())
    )
    assert pairs
    for (name_a, a), (_, b) in pairs:
        assert torch.equal(a, b), name_a
    case.check(straight, resumed, folder)
