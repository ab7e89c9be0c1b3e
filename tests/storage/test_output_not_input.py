"""A writer refuses an output that is, contains or lies inside its own inputs, before anything
is moved: `export RUN/checkpoint-2 --out RUN/checkpoint-2 --overwrite_output_dir` (or `--out
RUN`) used to move the checkpoint aside and then fail, leaving the run without it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hydrappo.cli import main
from hydrappo.storage.rundir import LOCK_NAME, OutputDirError, claim_output_dir, claim_output_path, refuse_own_inputs

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


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


@pytest.fixture
def live_run(tmp_path):
    """A folder with a run's files whose lock another (live) process holds, as a training run does."""
    folder = tmp_path / "live"
    (folder / "checkpoint-1").mkdir(parents=True)
    (folder / "checkpoint-1" / "trainable.safetensors").write_bytes(b"weights")
    (folder / "metrics.jsonl").write_text("{}\n")
    code = ("import time\nfrom hydrappo.storage.rundir import lock_output_dir, name_lock_holder\n"
            f"lock_output_dir({str(folder)!r})\nname_lock_holder({str(folder)!r})\nprint('locked', flush=True)\ntime.sleep(600)\n")  # fmt: skip
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
