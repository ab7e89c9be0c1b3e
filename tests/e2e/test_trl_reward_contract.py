"""TRL's reward contract, as TRL's GRPOTrainer calls reward functions: `trainer_state`,
`log_metric` and `log_extra` (their scalars reach metrics.jsonl and TensorBoard, their columns the
samples table), `async def` functions awaited together, and `None` for a sample no function
scores (it leaves the group baseline and the loss; the fraction is logged)."""

import asyncio
import json
import time

import pytest
import torch

from hydrappo.algo.scores import fill_unscored
from hydrappo.cli import main
from hydrappo.rewards import FunctionReward, RewardContext, RewardSources
from hydrappo.train.ppo.step import Scored

from runs import ROOT, TINY

FIXTURE = ROOT / "tests" / "fixtures" / "trl_contract_rewards.py"


def test_unscored_samples_leave_the_group_mean_by_hand():
    scores = torch.tensor(
        [1.0, float("nan"), 3.0, 2.0, float("nan"), float("nan"), float("nan"), 5.0], dtype=torch.float64
    )
    filled, unscored = fill_unscored(scores, 4)
    assert filled.tolist() == [1.0, 2.0, 3.0, 2.0, 5.0, 5.0, 5.0, 5.0]  # each group's scored mean: 2 and 5
    assert unscored.tolist() == [False, True, False, False, True, True, True, False]
    filled, _ = fill_unscored(torch.tensor([float("nan")] * 2, dtype=torch.float64), 2)
    assert filled.tolist() == [0.0, 0.0]  # a group nobody scored: no signal


def test_async_functions_are_awaited_together_and_none_sums_as_nothing():
    started = []

    async def slow_a(completions, **kwargs):
        started.append(time.perf_counter())
        await asyncio.sleep(0.4)
        return [1.0, None, None]

    async def slow_b(completions, **kwargs):
        started.append(time.perf_counter())
        await asyncio.sleep(0.4)
        return [2.0, 3.0, None]

    sources = RewardSources([("a", 1.0, FunctionReward(slow_a)), ("b", 0.5, FunctionReward(slow_b))])
    context = RewardContext(max_steps=4)
    begin = time.perf_counter()
    scores = sources(["x"] * 3, ["p"] * 3, ["x"] * 3, context=context).total
    assert (
        time.perf_counter() - begin < 0.75 and abs(started[0] - started[1]) < 0.2
    )  # together, not one after the other
    assert scores[:2].tolist() == [2.0, 1.5] and torch.isnan(scores[2])  # None: 0 in the sum; None everywhere: unscored


@pytest.mark.slow
def test_a_trl_reward_file_using_all_of_it_runs_unchanged(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    code = main(
        [
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(out),
            "--total_steps",
            "3",
            "--batch_size",
            "16",
            "--mini_batch_size",
            "8",
            "--ppo_epochs",
            "1",
            "--max_new_tokens",
            "4",
            "--no_progress_bar",
            "--num_generations",
            "4",
            "--advantage_estimator",
            "grpo",
            "--beta",
            "0",
            "--log_samples_every",
            "1",
            "--reward_fn",
            f"{FIXTURE}:good_words,{FIXTURE}:short_bonus",
            "--reward_weights",
            "1",
            "1",
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["reward_metrics/progress"] for row in rows] == [
        0.0,
        1 / 3,
        2 / 3,
    ]  # trainer_state.global_step / max_steps
    assert all(row["reward_metrics/async_calls"] == 1.0 for row in rows)
    assert any(row["env/unscored_frac"] > 0 for row in rows) and all(row["env/unscored_frac"] < 1 for row in rows)
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    assert {"reward_metrics/progress", "reward_metrics/async_calls", "env/unscored_frac"} <= set(
        events.Tags()["scalars"]
    )
    texts = [event.tensor_proto.string_val[0].decode() for event in events.Tensors("samples/text_summary")]
    assert texts and all("| good_words |" in text.splitlines()[0] for text in texts)


@pytest.mark.slow
def test_an_unscored_sample_leaves_the_loss(tmp_path):
    from runs import tiny_trainer

    trainer = tiny_trainer(
        tmp_path / "out",
        "--advantage_estimator",
        "grpo",
        "--samples_per_prompt",
        "4",
        "--init_kl_coef",
        "0",
        "--batch_size",
        "8",
        "--mini_batch_size",
        "8",
        "--max_new_tokens",
        "4",
    )
    nan = float("nan")
    fixed = torch.tensor([nan, 1.0, nan, 0.0, nan, nan, nan, nan])
    trainer.ppo_step.score = lambda *args, **kwargs: Scored(total=fixed, parts={}, environment_stats={})
    experience, stats, _ = trainer.ppo_step.make_experience(trainer.ppo_step.step_plan())
    rows = experience.action_mask.sum(-1)
    assert rows[[0, 2, 4, 5, 6, 7]].tolist() == [0] * 6 and rows[[1, 3]].min() > 0  # unscored: no token in the loss
    assert stats["env/unscored_frac"] == 6 / 8 and stats["env/reward_mean"] == 0.5  # the scored samples' mean
    advantages = experience.advantages.sum(-1) / rows.clamp(min=1)
    assert advantages[1] > 0 > advantages[3]  # scored against their own mean (0.5), not the filled ones'
