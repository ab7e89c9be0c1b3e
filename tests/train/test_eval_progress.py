"""Held-out evaluation is visible while a run trains: the progress bar says when it evaluates and
keeps showing the latest eval/reward_mean, the step-0 evaluation is not counted in the first
step's time (it has its own time/eval), and the `done:` line gives the held-out result beside the
baseline."""

import logging
import time
from types import SimpleNamespace

import pytest

from hydrappo.cli import main
from hydrappo.train.harness import RunLog
from hydrappo.evaluation.heldout import held_out_summary

from runs import TINY

PROGRESS = {"reward": "env/reward_mean", "eval": "eval/reward_mean"}


def run_log(tmp_path, progress_bar=True):
    loop = SimpleNamespace(progress=PROGRESS, name="PPO")
    run = SimpleNamespace(progress_bar=progress_bar, log_samples_every=0, num_log_samples=4)
    return RunLog(tmp_path, 0, 5, loop, run)


def test_the_bar_keeps_the_latest_evaluation_and_its_clock_starts_after_the_baseline(tmp_path):
    log = run_log(tmp_path)
    try:
        time.sleep(0.5)  # the step-0 evaluation
        log.write(0, {"eval/reward_mean": 0.25, "time/eval": 0.5})
        log.bar.restart_clock()
        log.write(1, {"env/reward_mean": 1.0})
        assert log.bar.tqdm.postfix == "reward=1.000, eval=0.250"  # eval/* logged at step 0 only, still shown
        assert log.bar.tqdm.format_dict["elapsed"] < 0.4  # step 1's time, without the evaluation's
        log.write(2, {"env/reward_mean": 0.5, "eval/reward_mean": 0.75})
        assert log.bar.tqdm.postfix == "reward=0.500, eval=0.750"
        log.bar.status("step 2: evaluating 12 held-out prompts")
        assert log.bar.tqdm.desc == "PPO (step 2: evaluating 12 held-out prompts)"
        log.bar.status(None)
        assert log.bar.tqdm.desc == "PPO"
    finally:
        log.close()


def test_the_done_line_gives_the_held_out_result_beside_the_baseline():
    history = [
        {"step": 0, "eval/reward_mean": 0.25, "eval/solve_rate": 0.25},
        {"step": 1, "env/reward_mean": 0.1},
        {"step": 2, "env/reward_mean": 0.2, "eval/reward_mean": 0.75, "eval/solve_rate": 0.75},
    ]
    assert held_out_summary(history) == ", held-out reward 0.750 (step 0: 0.250), solved 0.750 (0.250)"
    assert held_out_summary(history[1:2]) == ""


@pytest.mark.slow
def test_a_run_with_held_out_prompts_reports_them(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="hydrappo")
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join((TINY / "prompts.jsonl").read_text().splitlines(keepends=True)[-6:]))
    code = main(
        [
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(tmp_path / "out"),
            "--total_steps",
            "2",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "8",
            "--ppo_epochs",
            "1",
            "--max_new_tokens",
            "4",
            "--no_progress_bar",
            "--eval_prompts",
            str(held_out),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "held-out reward" in out and "(step 0: " in out, out
    said = [r.getMessage() for r in caplog.records]
    assert "step 0: evaluating 6 held-out prompts" in said and "step 2: evaluating 6 held-out prompts" in said
