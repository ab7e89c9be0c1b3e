"""Held-out evaluation in the RL loop (train/heldout.py): the eval/* numbers by hand, when it
runs, and that it changes nothing about training: the same weights with and without it (exact
resume across it: tests/train/test_exact_resume.py)."""

import json
from pathlib import Path

import pytest
import torch

from hydrappo.config import ConfigError, parse_config
from hydrappo.train.heldout import evaluation_due, held_out_statistics

from runs import TINY, tiny_trainer

TINY_PROMPTS = TINY / "prompts.jsonl"


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_statistics_by_hand():
    stats = held_out_statistics(
        [1.0, 0.0, 1.0, 1.0],
        [3, 5, 4, 8],
        [True, True, False, True],
        [False, False, True, False],
        {"accuracy": [1.0, 0.0, 1.0, 1.0], "format": [0.5, 0.5, 0.0, 1.0]},
    )
    assert stats["eval/reward_mean"] == 0.75 and stats["eval/solve_rate"] == 0.75
    assert stats["eval/reward_std"] == pytest.approx(0.75**0.5 * 0.25**0.5)  # population std of a 3:1 split
    assert stats["eval/response_len_mean"] == 5.0 and stats["eval/missing_eos_frac"] == 0.25
    assert stats["eval/degenerate_frac"] == 0.25 and stats["eval/prompts"] == 4
    assert stats["eval/reward/accuracy"] == 0.75 and stats["eval/reward/format"] == 0.5
    # Scores that are not all 0/1 have no solve rate.
    assert "eval/solve_rate" not in held_out_statistics([0.5, 1.0], [1, 1], [True, True], [False, False])


def test_evaluation_points_are_step_zero_every_n_and_the_last():
    assert [s for s in range(11) if evaluation_due(s, 4, 10)] == [0, 4, 8, 10]
    assert [s for s in range(11) if evaluation_due(s, 0, 10)] == [0, 10]


def held_out_file(tmp_path: Path) -> Path:
    """12 of the tiny example's prompts, in a file of their own."""
    path = tmp_path / "held_out.jsonl"
    path.write_text("".join(TINY_PROMPTS.read_text().splitlines(keepends=True)[-12:]))
    return path


RUN = ["--total_steps", "4", "--save_every", "2", "--batch_size", "8", "--mini_batch_size", "4", "--ppo_epochs", "1"]


@pytest.mark.slow
def test_evaluation_logs_at_step_zero_and_every_n_and_leaves_training_unchanged(tmp_path):
    # Sampled answers (eval_greedy false) are the strict case: they draw random numbers.
    evaluated = tiny_trainer(
        tmp_path / "eval",
        *RUN,
        "--eval_prompts",
        str(held_out_file(tmp_path)),
        "--eval_every",
        "3",
        "--eval_greedy",
        "false",
    )
    evaluated.train()
    plain = tiny_trainer(tmp_path / "plain", *RUN)
    plain.train()
    for a, b in zip(evaluated.hydra.trainable_parameters(), plain.hydra.trainable_parameters()):
        assert torch.equal(a, b)
    rows = metrics(tmp_path / "eval")
    assert [row["step"] for row in rows if "eval/reward_mean" in row] == [0, 3, 4]
    assert rows[0]["eval/prompts"] == 12 and 0.0 <= rows[0]["eval/reward_mean"] <= 1.0
    for with_eval, without in zip(rows[1:], metrics(tmp_path / "plain")):
        assert {k: v for k, v in with_eval.items() if not k.startswith(("eval/", "time/"))} == {
            k: v for k, v in without.items() if not k.startswith("time/")
        }
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "eval" / "tensorboard")).Reload()
    assert "eval_samples" in " ".join(events.Tags()["tensors"])


def test_evaluation_options_are_checked_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="train.eval_every=2 has nothing to evaluate without data.eval_prompts"):
        parse_config(TINY / "config.yaml", ["--eval_every", "2"])
    with pytest.raises(ConfigError, match="data.eval_prompts="):
        parse_config(TINY / "config.yaml", ["--eval_prompts", str(tmp_path / "missing.jsonl")])


def test_a_held_out_file_without_the_prompt_column_is_a_clear_error(tmp_path):
    path = tmp_path / "held_out.jsonl"
    path.write_text('{"question": "n1 n2"}\n')
    from hydrappo.data import DataError

    with pytest.raises(DataError, match="data.eval_prompts"):
        tiny_trainer(tmp_path / "run", "--eval_prompts", str(path))
