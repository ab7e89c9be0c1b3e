"""A writer refuses an output that is, contains or lies inside its own inputs, before anything
is moved: `export RUN/checkpoint-2 --out RUN/checkpoint-2 --overwrite_output_dir` (or `--out
RUN`) used to move the checkpoint aside and then fail, leaving the run without it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hydrappo.cli import main
from hydrappo.storage.rundir import (
    LOCK_NAME,
    OutputDirError,
    claim_output_dir,
    claim_output_path,
    refuse_own_inputs,
    release_output_dir,
)

from runs import ROOT, TINY

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert (
        main(
            [
                "train",
                str(TINY / "config.yaml"),
                "--output_dir",
                str(out),
                "--total_steps",
                "1",
                "--batch_size",
                "4",
                "--mini_batch_size",
                "4",
                "--ppo_epochs",
                "1",
                "--max_new_tokens",
                "4",
                "--no_progress_bar",
            ]
        )
        == 0
    )
    return out


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    ("out", "how"), [("run/checkpoint-1", "is"), ("run", "contains"), ("run/checkpoint-1/policy", "lies inside")]
)
def test_export_onto_its_own_checkpoint_or_run_is_refused_and_nothing_moves(run, capsys, out, how):
    before = listing(run.parent)
    target = run.parent / out
    code = main(["export", str(run / "checkpoint-1"), "--out", str(target), "--overwrite_output_dir"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--out={str(target)!r} {how} the checkpoint ({run / 'checkpoint-1'}), which this command reads" in err, err
    assert listing(run.parent) == before


def test_training_into_its_own_model_folder_is_refused(tmp_path, capsys):
    code = main(
        ["train", str(TINY / "config.yaml"), "--output_dir", str(TINY / "model" / "runs"), "--total_steps", "1"]
    )
    assert code == 2
    assert (
        f"train.output_dir={str(TINY / 'model' / 'runs')!r} lies inside model.name_or_path" in capsys.readouterr().err
    )
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


@pytest.fixture
def live_run(tmp_path):
    """A folder with a run's files whose lock another (live) process holds, as a training run does."""
    folder = tmp_path / "live"
    (folder / "checkpoint-1").mkdir(parents=True)
    (folder / "checkpoint-1" / "trainable.safetensors").write_bytes(b"weights")
    (folder / "metrics.jsonl").write_text("{}\n")
    code = (
        "import time\nfrom hydrappo.storage.rundir import lock_output_dir, name_lock_holder\n"
        f"lock_output_dir({str(folder)!r})\nname_lock_holder({str(folder)!r})\nprint('locked', flush=True)\ntime.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    yield folder, holder
    holder.kill()
    holder.wait()


def test_export_over_a_run_that_is_training_is_refused_naming_the_holder(run, live_run, capsys):
    folder, holder = live_run
    before = listing(folder.parent)
    code = main(["export", str(run / "checkpoint-1"), "--out", str(folder), "--overwrite_output_dir"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--out {folder}: is the folder of a run that is training ({folder}, held by host " in err, err
    assert f"PID {holder.pid}, started " in err and "Wait for the run to end (or stop it)" in err
    assert listing(folder.parent) == before


@pytest.mark.parametrize(("where", "how"), [("live/checkpoint-1", "lies inside"), (".", "contains")])
def test_claiming_a_path_in_or_around_a_run_that_is_training_is_refused(live_run, where, how):
    folder, holder = live_run
    target = (folder.parent / where).resolve()
    before = listing(folder.parent)
    with pytest.raises(OutputDirError, match=f"{how} the folder of a run that is training .*PID {holder.pid},"):
        claim_output_path(target, overwrite=True, option="--out")
    assert listing(folder.parent) == before


def test_a_stale_lock_of_a_dead_run_does_not_block_overwriting(live_run):
    folder, holder = live_run
    holder.kill()
    holder.wait()
    assert (folder / LOCK_NAME).is_file()
    claim_output_path(folder, overwrite=True, option="--out")
    assert not folder.exists() and len(list(folder.parent.glob("live.previous-*"))) == 1


def test_a_new_run_over_a_folder_that_holds_a_run_in_training_is_refused(live_run):
    folder, holder = live_run
    (folder.parent / "metrics.jsonl").write_text("{}\n")  # an earlier run in the parent, and the live one inside it
    before = listing(folder.parent)
    with pytest.raises(OutputDirError, match=f"contains the folder of a run that is training .*PID {holder.pid},"):
        claim_output_dir(folder.parent, overwrite=True)
    assert listing(folder.parent) == before


# --------------------------------------------------------------------------- inputs read once as a run starts
def earlier_run_with(folder: Path, *files: str) -> list[str]:
    """`folder` holding an earlier run (a metrics file) and copies of the tiny example's `files`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("{}\n")
    for name in files:
        (folder / name).write_text((TINY / name).read_text())
    return listing(folder)


def tiny_config(path: Path, **changes) -> Path:
    """The tiny example's config at `path`, its inputs named by absolute paths (except `changes`)."""
    text = (TINY / "config.yaml").read_text().replace("name_or_path: model", f"name_or_path: {TINY / 'model'}")
    text = text.replace("prompts: prompts.jsonl", f"prompts: {TINY / 'prompts.jsonl'}")
    for old, new in changes.items():
        text = text.replace(f"{old}: ", f"{old}: {new}  #", 1)
    path.write_text(text)
    return path


def test_a_new_run_over_the_folder_that_holds_its_config_and_reward_file_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    before = earlier_run_with(run, "reward.py")
    config = tiny_config(run / "config.yaml")
    before = listing(run)
    assert main(["train", str(config), "--output_dir", str(run), "--overwrite_output_dir"]) == 2
    err = capsys.readouterr().err
    assert f"train.output_dir={str(run)!r} contains the config file ({config}), which this command reads" in err, err
    assert listing(run) == before and not list(tmp_path.glob("run.previous-*"))


def test_a_new_run_over_the_folder_of_its_reward_module_is_refused(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    earlier_run_with(run)
    (run / "my_reward.py").write_text((TINY / "reward.py").read_text())
    monkeypatch.syspath_prepend(str(run))  # `my_reward:reward_fn` imports from there
    before = listing(run)
    config = tiny_config(tmp_path / "config.yaml", reward_fn="my_reward:reward_fn")
    assert main(["train", str(config), "--output_dir", str(run), "--overwrite_output_dir"]) == 2
    err = capsys.readouterr().err
    assert f"contains reward.reward_fn='my_reward:reward_fn' ({run / 'my_reward.py'})" in err, err
    assert listing(run) == before


def test_a_folder_holding_its_config_is_a_run_folder_when_nothing_is_moved(tmp_path):
    # Read once as the run starts, a config file inside output_dir is no obstacle unless the folder would move.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("{}\n")
    try:
        assert (
            claim_output_dir(tmp_path / "run", read_once={"the config file": tmp_path / "run" / "config.yaml"}) is None
        )
    finally:
        release_output_dir(tmp_path / "run")


def test_a_new_run_over_the_folder_that_holds_its_resume_checkpoint_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    earlier_run_with(out)
    (out / "inner" / "checkpoint-4").mkdir(parents=True)
    (out / "inner" / "checkpoint-4" / "trainable.safetensors").write_bytes(b"weights")
    before = listing(out)
    code = main(
        [
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(out),
            "--resume",
            str(out / "inner" / "checkpoint-4"),
            "--overwrite_output_dir",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert f"contains the checkpoint to resume from ({out / 'inner' / 'checkpoint-4'})" in err, err
    assert listing(out) == before
    # A run inside the checkpoint it starts from is refused, overwrite or not.
    assert (
        main(
            [
                "train",
                str(TINY / "config.yaml"),
                "--output_dir",
                str(out / "inner" / "checkpoint-4" / "sub"),
                "--resume",
                str(out / "inner" / "checkpoint-4"),
            ]
        )
        == 2
    )
    assert "lies inside the checkpoint to resume from" in capsys.readouterr().err
    assert listing(out) == before


# --------------------------------------------------------------------------- the Python API
@pytest.mark.parametrize("case", ["model folder", "prompts file", "config file"])
def test_the_python_api_refuses_an_output_dir_over_its_inputs_before_anything_moves(tmp_path, case):
    from hydrappo import PPOTrainer

    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text((TINY / "model" / name).read_text())
    prompts = tmp_path / "data" / "prompts.jsonl"
    prompts.parent.mkdir()
    prompts.write_text((TINY / "prompts.jsonl").read_text())
    out = {"model folder": model, "prompts file": prompts.parent, "config file": tmp_path / "run"}[case]
    (out / "metrics.jsonl").parent.mkdir(exist_ok=True)
    (out / "metrics.jsonl").write_text("{}\n")  # an earlier run there: overwrite would move it aside
    options = {
        "model": {"random_init": True},
        "ppo": {"batch_size": 4, "mini_batch_size": 4, "ppo_epochs": 1},
        "generation": {"max_new_tokens": 4},
        "train": {"output_dir": str(out), "overwrite_output_dir": True, "total_steps": 1, "progress_bar": False},
    }
    args = options
    if case == "config file":
        import yaml

        args = out / "config.yaml"
        args.write_text(yaml.safe_dump(options))
    before = listing(tmp_path)
    expected = {
        "model folder": "is model.name_or_path",
        "prompts file": "contains data.prompts",
        "config file": "contains the config file",
    }[case]
    with pytest.raises(OutputDirError, match=f"train.output_dir=.* {expected} "):
        trainer = PPOTrainer(
            model=str(model),
            reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
            train_dataset=prompts,
            args=args,
        )
        trainer.train()  # (a config file inside the folder is refused when the run would move it aside)
    assert listing(tmp_path) == before


# --------------------------------------------------------------------------- generate / compare --output
def test_generate_output_never_replaces_a_file_of_the_run_it_reads(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    for checkpoint, how in ((run / "checkpoint-1", "the run of the checkpoint"), (run, "the checkpoint")):
        code = main(["generate", str(checkpoint), "--output", str(run / "metrics.jsonl"), "--overwrite"])
        assert code == 2
        assert f"--output={str(run / 'metrics.jsonl')!r} lies inside {how} ({run})" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n' and listing(run) == ["checkpoint-1", "metrics.jsonl"]


def test_generate_and_compare_output_never_replace_an_existing_file_without_overwrite(tmp_path, capsys):
    report = tmp_path / "report.md"
    report.write_text("an earlier report\n")
    for argv in (
        ["generate", str(tmp_path / "run")],
        ["compare", str(tmp_path / "a"), "--prompts", str(TINY / "prompts.jsonl")],
    ):
        assert main([*argv, "--output", str(report)]) == 2
        assert (
            f"--output={str(report)!r} already exists; choose another file, or pass --overwrite"
            in capsys.readouterr().err
        )
    assert report.read_text() == "an earlier report\n"


def test_the_comparison_written_over_an_existing_file_moves_it_aside(tmp_path):
    from hydrappo.evaluation.tables import write_comparison

    report = tmp_path / "report.jsonl"
    report.write_text("an earlier report\n")
    write_comparison({"a": [{"prompt": "p", "response": "r"}]}, report, overwrite=True)
    (earlier,) = tmp_path.glob("report.jsonl.previous-*")
    assert earlier.read_text() == "an earlier report\n" and '"model": "a"' in report.read_text()
