"""A message names an option as the user gives it (errors.spell): `--resume` and
`--overwrite_output_dir` on the command line, `trainer.train(resume=True)` and
`args={"train": {"overwrite_output_dir": True}}` in Python. The same refusal, both ways."""

import json

import pytest

from hydrappo import PPOTrainer
from hydrappo.cli import main
from hydrappo.errors import on_the_command_line, spell
from hydrappo.storage.checkpoint import CheckpointError, resolve_resume
from hydrappo.storage.rundir import OutputDirError, claim_output_dir

from runs import FAST_ONE_STEP, TINY

PYTHON_OVERWRITE = 'args={"train": {"overwrite_output_dir": True}}'


def test_each_front_spells_an_option_its_own_way(tmp_path):
    assert spell("resume") == "trainer.train(resume=True)"
    assert spell("resume", tmp_path / "checkpoint-2") == f"trainer.train(resume={str(tmp_path / 'checkpoint-2')!r})"
    assert spell("train.overwrite_output_dir") == PYTHON_OVERWRITE
    with on_the_command_line():
        assert spell("resume") == "--resume"
        assert spell("resume", "PATH") == "--resume PATH"
        assert spell("train.overwrite_output_dir") == "--overwrite_output_dir"
    assert spell("resume") == "trainer.train(resume=True)"  # back to Python's once the command returns


def test_the_command_lines_spelling_ends_with_the_command_even_when_it_fails():
    with pytest.raises(RuntimeError), on_the_command_line():
        raise RuntimeError
    assert spell("resume").startswith("trainer.train")


def earlier_run(tmp_path):
    out = tmp_path / "out"
    (out / "checkpoint-1").mkdir(parents=True)
    return out


def test_a_reused_output_folder_in_python(tmp_path):
    with pytest.raises(OutputDirError) as refused:
        claim_output_dir(earlier_run(tmp_path))
    message = str(refused.value)
    assert f"Continue it with trainer.train(resume=True), start a new run over it with {PYTHON_OVERWRITE}" in message
    assert "--" not in message


def test_a_reused_output_folder_on_the_command_line(tmp_path):
    with pytest.raises(OutputDirError) as refused, on_the_command_line():
        claim_output_dir(earlier_run(tmp_path))
    assert "Continue it with --resume, start a new run over it with --overwrite_output_dir" in str(refused.value)


def test_resume_and_overwrite_together(tmp_path):
    out = earlier_run(tmp_path)
    with pytest.raises(OutputDirError, match=f"trainer.train.resume=True. continues .* and {PYTHON_OVERWRITE}"):
        claim_output_dir(out, resume=True, overwrite=True)
    with pytest.raises(OutputDirError, match="--resume continues .* and --overwrite_output_dir would move"):
        with on_the_command_line():
            claim_output_dir(out, resume=True, overwrite=True)


def test_a_checkpoint_that_is_not_there(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointError) as refused:
        resolve_resume(missing, tmp_path)
    assert str(refused.value).startswith(f"trainer.train(resume={str(missing)!r}): no such checkpoint folder")
    assert "or trainer.train(resume=True) for the latest" in str(refused.value)
    with pytest.raises(CheckpointError, match=f"^--resume {missing}: no such checkpoint folder"):
        with on_the_command_line():
            resolve_resume(missing, tmp_path)
    with pytest.raises(CheckpointError, match=r"^trainer.train\(resume=True\): no checkpoint found"):
        resolve_resume(True, tmp_path)


def test_a_trainer_built_in_python_says_pythons_words_and_the_command_line_its_own(tmp_path, capsys):
    out = earlier_run(tmp_path)
    rows = [json.loads(line) for line in (TINY / "prompts.jsonl").read_text().splitlines()]
    trainer = PPOTrainer(
        model=str(TINY / "model"),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        train_dataset=rows,
        args={"model": {"random_init": True}, "output_dir": str(out), "batch_size": 8, "mini_batch_size": 8},
    )
    with pytest.raises(OutputDirError, match=r"Continue it with trainer\.train\(resume=True\)"):
        trainer.train()
    code = main(["train", str(TINY / "config.yaml"), "--output_dir", str(out), *FAST_ONE_STEP])
    assert code == 2
    assert "Continue it with --resume, start a new run over it with --overwrite_output_dir" in capsys.readouterr().err
