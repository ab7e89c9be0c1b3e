"""A row without a value in a column a reward function needs: refused before anything is written
when the function names the column (a parameter without a default), and otherwise (a function
that reads **kwargs) an error that names the step it failed at (0 for the step-0 evaluation) and
the row without a value, not sample 0."""

import json
import textwrap
from pathlib import Path

import pytest

from hydrappo.cli import main

from runs import TINY

REWARDS = textwrap.dedent(
    """
    def named(completions, answer, **kwargs):  # TRL's convention, the column as a parameter
        return [float(a.lower() in c) for c, a in zip(completions, answer)]

    def from_kwargs(completions, **kwargs):  # the column read from **kwargs: not checkable before the run
        return [float(a.lower() in c) for c, a in zip(completions, kwargs["answer"])]
    """
)
FAST = [
    "--batch_size",
    "8",
    "--mini_batch_size",
    "8",
    "--ppo_epochs",
    "1",
    "--max_new_tokens",
    "4",
    "--no_progress_bar",
    "--total_steps",
    "1",
]


def table(path: Path, count: int, missing: int | None = None) -> Path:
    prompts = [json.loads(line)["prompt"] for line in (TINY / "prompts.jsonl").read_text().splitlines()][:count]
    rows = [{"prompt": p, **({} if i == missing else {"answer": "G1"})} for i, p in enumerate(prompts)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_row_without_a_needed_value_is_refused_before_anything_is_written(tmp_path, capsys):
    (tmp_path / "rewards.py").write_text(REWARDS)
    prompts = table(tmp_path / "prompts.jsonl", 16, missing=5)
    code = main(
        [
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(tmp_path / "out"),
            "--prompts",
            str(prompts),
            "--reward_fn",
            f"{tmp_path / 'rewards.py'}:named",
            *FAST,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"data.prompts={prompts}: row 5 (counting from 0) has no value in column 'answer' (None)" in err
    assert "1 of 16 rows lack it (rows 5)" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_the_same_in_the_held_out_table(tmp_path, capsys):
    (tmp_path / "rewards.py").write_text(REWARDS)
    code = main(
        [
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(tmp_path / "out"),
            "--prompts",
            str(table(tmp_path / "prompts.jsonl", 16)),
            "--eval_prompts",
            str(table(tmp_path / "eval.jsonl", 4, missing=2)),
            "--reward_fn",
            f"{tmp_path / 'rewards.py'}:named",
            *FAST,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "eval.jsonl: row 2 (counting from 0) has no value in column 'answer'" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_failure_in_the_step_zero_evaluation_names_step_zero_and_the_row(tmp_path, capsys):
    (tmp_path / "rewards.py").write_text(REWARDS)
    code = main(
        [
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(tmp_path / "out"),
            "--prompts",
            str(table(tmp_path / "prompts.jsonl", 16)),
            "--eval_prompts",
            str(table(tmp_path / "eval.jsonl", 4, missing=2)),
            "--reward_fn",
            f"{tmp_path / 'rewards.py'}:from_kwargs",
            *FAST,
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"reward function '{tmp_path / 'rewards.py'}:from_kwargs' at step 0 raised AttributeError" in err, err
    assert "data.eval_prompts row 2 has no 'answer' (None). Sample 2: prompt" in err
