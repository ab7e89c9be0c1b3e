"""--resume compares the checkpoint's config.yaml with this run's options: a changed option
the checkpoint cannot be resumed with is refused by name, the others are listed in a warning
and take effect (storage/resume.py)."""

from __future__ import annotations

import logging

import pytest

from hydrappo.config import Config
from hydrappo.storage.resume import resume_differences
from hydrappo.storage.checkpoint import CheckpointError

from runs import FAST_ONE_STEP, tiny_trainer


def test_each_changed_option_is_named_with_both_values():
    saved = Config().to_dict()
    now = Config().to_dict()
    now["model"]["num_layers_unfrozen"] = 4
    now["ppo"]["learning_rate"] = 3e-6
    now["train"]["total_steps"] = 7
    now["train"]["progress_bar"] = False  # how the run shows progress: not reported
    now["ppo"]["init_kl_coef"] = 0.2
    refusals, warnings = resume_differences(saved, now)
    assert refusals == [
        "model.num_layers_unfrozen: 2 in the checkpoint, 4 now; it decides which weights the checkpoint holds; "
        "resume with 2 or start a new run"
    ]
    assert "ppo.learning_rate: 1e-05 in the checkpoint, 3e-06 now" in warnings
    assert "train.total_steps: 100 in the checkpoint, 7 now" in warnings
    assert any(w.startswith("ppo.init_kl_coef") and "changes nothing on resume" in w for w in warnings)
    assert len(warnings) == 3


@pytest.mark.parametrize(
    "section, option, value, why",
    [
        ("model", "train_lm_head", True, "which weights"),
        ("lora", "lora_r", 8, "which weights"),
        ("lora", "lora_alpha", 32.0, "scales the adapters"),
        ("ppo", "advantage_estimator", "grpo", "value head"),
        ("ppo", "optimizer", "adamw8bit", "optimizer state"),
        ("ppo", "kl_controller", "fixed", "KL controller"),
        ("model", "name_or_path", "some-org/other-model", "trained on that model"),
    ],
)
def test_options_that_decide_what_the_checkpoint_holds_are_refused(section, option, value, why):
    saved, now = Config().to_dict(), Config().to_dict()
    saved["model"]["name_or_path"] = "some-org/a-model"
    now["model"]["name_or_path"] = "some-org/a-model"
    now[section][option] = value
    refusals, warnings = resume_differences(saved, now)
    assert len(refusals) == 1 and not warnings
    assert refusals[0].startswith(f"{section}.{option}: ") and why in refusals[0] and "resume with" in refusals[0]


def test_a_stage_refuses_another_batch_size_and_seed_a_random_model_refuses_another_seed():
    from hydrappo.config import SFTConfig

    saved, now = SFTConfig().to_dict(), SFTConfig().to_dict()
    now["train"]["batch_size"] = 8
    now["train"]["learning_rate"] = 1e-3
    refusals, warnings = resume_differences(saved, now)
    assert [r.split(":")[0] for r in refusals] == ["train.batch_size"] and "counts batches" in refusals[0]
    assert [w.split(":")[0] for w in warnings] == ["train.learning_rate"]
    now = SFTConfig().to_dict()
    now["train"]["seed"] = 1
    refusals, _ = resume_differences(saved, now, SFTConfig.SEEDED_DATA)
    assert "the held-out split and the batches were drawn from it" in refusals[0]
    saved, now = Config().to_dict(), Config().to_dict()
    now["train"]["seed"] = 1
    assert resume_differences(saved, now)[0] == []  # PPO on a pretrained model: the seed changes nothing
    saved["model"]["random_init"] = now["model"]["random_init"] = True
    assert "random model was built from it" in resume_differences(saved, now)[0][0]


def test_a_moved_model_folder_is_a_warning_not_a_refusal(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for name in "ab":
        (tmp_path / name / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}')
    saved, now = Config().to_dict(), Config().to_dict()
    saved["model"]["name_or_path"], now["model"]["name_or_path"] = str(tmp_path / "a"), str(tmp_path / "b")
    refusals, warnings = resume_differences(saved, now)
    assert not refusals and "the same config.json" in warnings[0]
    saved["model"]["name_or_path"] = str(tmp_path / "gone")
    refusals, warnings = resume_differences(saved, now)
    assert not refusals and "folder is gone" in warnings[0]
    (tmp_path / "b" / "config.json").write_text('{"model_type": "llama", "hidden_size": 16}')
    saved["model"]["name_or_path"] = str(tmp_path / "a")
    assert resume_differences(saved, now)[0]


@pytest.mark.slow
def test_resume_refuses_a_changed_layer_count_and_applies_a_changed_learning_rate(tmp_path, caplog):
    run = tmp_path / "run"
    tiny_trainer(run, *FAST_ONE_STEP).train()
    with pytest.raises(CheckpointError) as refused:
        tiny_trainer(run, *FAST_ONE_STEP, "--total_steps", "2", "--num_layers_unfrozen", "1").train(resume=True)
    assert str(refused.value) == (
        f"trainer.train(resume={str(run / 'checkpoint-1')!r}): model.num_layers_unfrozen: 2 in the checkpoint, 1 now; "
        "it decides which weights the checkpoint holds; resume with 2 or start a new run."
    )
    caplog.set_level(logging.WARNING, logger="hydrappo")
    trainer = tiny_trainer(
        run, *FAST_ONE_STEP, "--total_steps", "2", "--learning_rate", "1e-3", "--weight_decay", "0.01"
    )
    history = trainer.train(resume=True)
    assert [row["step"] for row in history] == [2]
    assert "ppo.learning_rate: 0.003 in the checkpoint, 0.001 now" in caplog.text
    assert "train.total_steps: 1 in the checkpoint, 2 now" in caplog.text
    group = trainer.harness.optimizer.param_groups[0]
    assert group["lr"] == 1e-3 and group["weight_decay"] == 0.01 and history[0]["lr"] == 1e-3
