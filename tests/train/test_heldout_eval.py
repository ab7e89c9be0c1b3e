"""Held-out evaluation in the RL loop (evaluation/heldout.py): the eval/* numbers by hand, when it
runs, and that it changes nothing about training: the same weights with and without it (exact
resume across it: tests/train/test_exact_resume.py)."""

import json
from pathlib import Path

import pytest
import torch

from hydrappo.config import ConfigError, parse_config
from hydrappo.errors import UsageError
from hydrappo.generation.responses import Responses
from hydrappo.prompts import PromptSet
from hydrappo.train.distributed import ProcessGroup
from hydrappo.evaluation.heldout import HeldOutEvaluation, evaluation_due, held_out_statistics

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


def test_solved_share_of_a_partial_credit_reward():
    """A task's verifier gives partial credit; eval/solved/<task> counts only full scores, over the
    answers that task scored (NaN: another task's item)."""
    nan = float("nan")
    parts = {"chain_sum": [1.0, 0.25, nan, 1.0, 0.0], "gcd": [nan, nan, 0.5, nan, nan]}
    stats = held_out_statistics(
        [1.0, 0.25, 0.5, 1.0, 0.0], [2] * 5, [True] * 5, [False] * 5, parts, solved_parts=("chain_sum", "gcd")
    )
    assert stats["eval/solved/chain_sum"] == 0.5  # 2 of its 4 answers
    assert stats["eval/solved/gcd"] == 0.0 and stats["eval/reward/gcd"] == 0.5
    assert "eval/solved/chain_sum" not in held_out_statistics([1.0], [2], [True], [False], {"chain_sum": [1.0]})


class _Tokens:
    def batch_decode(self, ids, skip_special_tokens=True):
        return [" ".join(map(str, row)) for row in ids]


def _sampled_evaluation(prompts: int, samples_per_prompt: int, batch_size: int):
    """A HeldOutEvaluation whose 'policy' answers each prompt with one token drawn from the torch
    stream (so two answers agree only if they drew the same number) and whose reward is 1 for
    the prompt rows listed in `solved`."""
    prompt_set = PromptSet(
        texts=[f"q{i}" for i in range(prompts)], formatted=[], input_ids=[[i] for i in range(prompts)]
    )
    evaluation = HeldOutEvaluation(
        prompt_set, _Tokens(), batch_size=batch_size, greedy=False, seed=3, samples_per_prompt=samples_per_prompt
    )
    answered = []

    def generate(prompt_ids, greedy, rows):
        answered.extend(rows)
        draws = torch.randint(0, 10**9, (len(rows),)).tolist()
        return Responses(prompt_ids=prompt_ids, response_ids=[[d] for d in draws], ended=[True] * len(rows))

    def score(rows, prompt_texts, responses):
        return torch.tensor([1.0 if row == 0 else 0.0 for row in rows]), None

    return evaluation, generate, score, answered


def test_several_sampled_answers_per_prompt_each_from_its_own_draw():
    # 3 prompts, 4 answers each, batches of 2: each prompt's answers fill two batches, which start
    # at the same prompt, so seeding a batch by its first prompt would repeat its draws.
    evaluation, generate, score, answered = _sampled_evaluation(prompts=3, samples_per_prompt=4, batch_size=2)
    stats, samples = evaluation.run(step=2, dist=ProcessGroup(), generate=generate, score=score)
    assert answered == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    responses = [row["response"] for row in samples]
    assert len(responses) == 12 and len(set(responses)) == 12  # no two answers share a draw
    assert [row["prompt"] for row in samples] == ["q0"] * 4 + ["q1"] * 4 + ["q2"] * 4
    # The numbers are over all 12 answers; eval/prompts still counts prompts.
    assert stats["eval/reward_mean"] == 4 / 12 and stats["eval/solve_rate"] == 4 / 12
    assert stats["eval/prompts"] == 3 and stats["eval/answers_per_prompt"] == 4
    # The same step draws the same answers again (evaluation is seeded), another step others.
    again, _, _, _ = _sampled_evaluation(prompts=3, samples_per_prompt=4, batch_size=2)
    assert [row["response"] for row in again.run(2, ProcessGroup(), generate, score)[1]] == responses
    assert [row["response"] for row in again.run(3, ProcessGroup(), generate, score)[1]] != responses


def test_one_answer_per_prompt_is_seeded_by_its_batch_as_before():
    # With one answer per prompt a batch's start is its first prompt row: the seed of earlier runs.
    evaluation, generate, score, _ = _sampled_evaluation(prompts=4, samples_per_prompt=1, batch_size=2)
    stats, samples = evaluation.run(step=1, dist=ProcessGroup(), generate=generate, score=score)
    expected = []
    for first in (0, 2):
        torch.manual_seed(3 * 1_000_003 + 1 * 10_007 + first)
        expected += torch.randint(0, 10**9, (2,)).tolist()
    assert [row["response"] for row in samples] == [str(d) for d in expected]
    assert stats["eval/prompts"] == 4 and "eval/answers_per_prompt" not in stats


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
    # Sampled answers (eval_greedy false), two to each prompt, are the strict case: they draw
    # random numbers.
    evaluated = tiny_trainer(
        tmp_path / "eval",
        *RUN,
        "--eval_prompts",
        str(held_out_file(tmp_path)),
        "--eval_every",
        "3",
        "--eval_greedy",
        "false",
        "--eval_samples_per_prompt",
        "2",
    )
    evaluated.train()
    plain = tiny_trainer(tmp_path / "plain", *RUN)
    plain.train()
    for a, b in zip(evaluated.hydra.trainable_parameters(), plain.hydra.trainable_parameters()):
        assert torch.equal(a, b)
    rows = metrics(tmp_path / "eval")
    assert [row["step"] for row in rows if "eval/reward_mean" in row] == [0, 3, 4]
    assert rows[0]["eval/prompts"] == 12 and rows[0]["eval/answers_per_prompt"] == 2
    assert 0.0 <= rows[0]["eval/reward_mean"] <= 1.0
    for with_eval, without in zip(rows[1:], metrics(tmp_path / "plain")):
        assert {k: v for k, v in with_eval.items() if not k.startswith(("eval/", "time/"))} == {
            k: v for k, v in without.items() if not k.startswith("time/")
        }
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "eval" / "tensorboard")).Reload()
    tags = events.Tags()["tensors"]
    assert "eval_samples" in " ".join(tags)
    # The step-0 baseline's answers are held-out answers: under eval_samples, not the training samples.
    by_tag = {tag: [event.step for event in events.Tensors(tag)] for tag in tags}
    assert any(0 in steps for tag, steps in by_tag.items() if tag.startswith("eval_samples"))
    assert not any(0 in steps for tag, steps in by_tag.items() if tag.startswith("samples"))
    # trainer.evaluate() after train() (a Trainer user's first call) is the held-out evaluation: at
    # the step the run ended, it gives the numbers the last evaluation logged.
    again = evaluated.evaluate()
    assert {k: v for k, v in again.items() if not k.startswith("time/")} == {
        k: v for k, v in rows[-1].items() if k.startswith("eval/")
    }
    with pytest.raises(UsageError, match="eval_dataset"):
        plain.evaluate()


def test_evaluation_options_are_checked_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="train.eval_every=2 has nothing to evaluate without data.eval_prompts"):
        parse_config(TINY / "config.yaml", ["--eval_every", "2"])
    with pytest.raises(ConfigError, match="data.eval_prompts="):
        parse_config(TINY / "config.yaml", ["--eval_prompts", str(tmp_path / "missing.jsonl")])
    with pytest.raises(
        ConfigError, match="eval_samples_per_prompt=3 has nothing to evaluate without data.eval_prompts"
    ):
        parse_config(TINY / "config.yaml", ["--eval_samples_per_prompt", "3", "--eval_greedy", "false"])
    held_out = ["--eval_prompts", str(TINY_PROMPTS)]
    with pytest.raises(ConfigError, match="greedy answers to a prompt are all the same.*eval_greedy: false"):
        parse_config(TINY / "config.yaml", [*held_out, "--eval_samples_per_prompt", "3"])
    with pytest.raises(ConfigError, match="eval_samples_per_prompt"):
        parse_config(TINY / "config.yaml", [*held_out, "--eval_samples_per_prompt", "0", "--eval_greedy", "false"])
    sampled = parse_config(
        TINY / "config.yaml", [*held_out, "--eval_samples_per_prompt", "3", "--eval_greedy", "false"]
    )
    assert sampled.train.eval_samples_per_prompt == 3


def test_a_held_out_file_without_the_prompt_column_is_a_clear_error(tmp_path):
    path = tmp_path / "held_out.jsonl"
    path.write_text('{"question": "n1 n2"}\n')
    from hydrappo.data import DataError

    with pytest.raises(DataError, match="data.eval_prompts"):
        tiny_trainer(tmp_path / "run", "--eval_prompts", str(path))
