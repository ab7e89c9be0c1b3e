"""A writer refuses an output that is, contains or lies inside its own inputs, before anything
is moved: `export RUN/checkpoint-2 --out RUN/checkpoint-2 --overwrite_output_dir` (or `--out
RUN`) used to move the checkpoint aside and then fail, leaving the run without it."""

from pathlib import Path

import pytest

from hydrappo.cli import main
from hydrappo.storage.rundir import OutputDirError, refuse_own_inputs
from runs import TINY


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(["train", str(TINY / "config.yaml"), "--output_dir", str(out), "--total_steps", "1", "--batch_size", "4",
                 "--mini_batch_size", "4", "--ppo_epochs", "1", "--max_new_tokens", "4", "--no_progress_bar"]) == 0  # fmt: skip
    return out


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(("out", "how"), [("run/checkpoint-1", "is"), ("run", "contains"), ("run/checkpoint-1/policy", "lies inside")])
def test_export_onto_its_own_checkpoint_or_run_is_refused_and_nothing_moves(run, capsys, out, how):
    before = listing(run.parent)
    target = run.parent / out
    code = main(["export", str(run / "checkpoint-1"), "--out", str(target), "--overwrite_output_dir"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--out={str(target)!r} {how} the checkpoint ({run / 'checkpoint-1'}), which this command reads" in err, err
    assert listing(run.parent) == before


def test_training_into_its_own_model_folder_is_refused(tmp_path, capsys):
    code = main(["train", str(TINY / "config.yaml"), "--output_dir", str(TINY / "model" / "runs"), "--total_steps", "1"])
    assert code == 2
    assert f"train.output_dir={str(TINY / 'model' / 'runs')!r} lies inside model.name_or_path" in capsys.readouterr().err
    assert not (TINY / "model" / "runs").exists()


def test_generate_output_onto_its_prompts_file_is_refused(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "n1 n2"}\n')
    assert main(["generate", str(tmp_path / "run"), "--prompts", str(prompts), "--output", str(prompts)]) == 2
    assert f"--output={str(prompts)!r} is --prompts" in capsys.readouterr().err
    assert prompts.read_text() == '{"prompt": "n1 n2"}\n'


def test_names_that_are_not_local_paths_are_not_inputs(tmp_path):
    refuse_own_inputs(tmp_path / "out", {"model.name_or_path": "Qwen/Qwen2.5-0.5B", "data.prompts": None}, "--out")
    with pytest.raises(OutputDirError, match="contains --x"):
        (tmp_path / "in").mkdir()
        refuse_own_inputs(tmp_path, {"--x": tmp_path / "in"}, "--out")
