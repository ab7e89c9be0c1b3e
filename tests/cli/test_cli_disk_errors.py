"""A write the operating system refuses (no space, permission, read-only file system, not a
directory) during a checkpoint, a metrics line or an export is one plain message: what could
not be written, where, why, what survives and what to do; exit code 1, never "this is a bug".

A full disk is tested twice: on a real small tmpfs where the test may mount one (root with
CAP_SYS_ADMIN; skipped with the reason elsewhere), and everywhere by making the writer raise
what a full disk raises (OSError ENOSPC, safetensors' SafetensorError wrapping it)."""

from __future__ import annotations

import errno
import gc
import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from hydrappo.cli import main
from hydrappo.errors import WriteError, describe_os_error, on_the_command_line
from hydrappo.storage import checkpoint as checkpoint_module
from hydrappo.storage.checkpoint import checkpoint_dirs, checkpoint_problems, save_checkpoint

from runs import FAST, TINY

CONFIG = str(TINY / "config.yaml")
DISK_FULL = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize(
    "error, words",
    [
        (OSError(errno.ENOSPC, "No space left on device"), ("no space left on device", "free space")),
        (DISK_FULL, ("no space left on device", "free space")),
        (PermissionError(errno.EACCES, "Permission denied"), ("permission denied", "writable")),
        (OSError(errno.EROFS, "Read-only file system"), ("read-only", "writable file system")),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory"), ("not a folder", "move that file")),
    ],
)
def test_os_errors_are_described_in_plain_words(error, words):
    reason, fix = describe_os_error(error)
    assert words[0] in reason and words[1] in fix
    assert describe_os_error(ValueError("not an OS error")) is None
    assert describe_os_error(FileExistsError("x")) is None  # no errno: hydrappo's own refusal, not the OS's


def _save(root: Path, step: int, state_size: int = 4) -> Path:
    return save_checkpoint(
        root,
        step,
        weights={"w": torch.zeros(4)},
        training_state={"x": torch.zeros(state_size)},
        trainer_state={},
        config_yaml="{}\n",
        keep_last=5,
    )


def test_a_full_disk_during_a_checkpoint_names_the_step_the_folder_and_what_survives(tmp_path, monkeypatch):
    _save(tmp_path, 2)

    def full(*args, **kwargs):
        raise DISK_FULL

    monkeypatch.setattr(checkpoint_module, "save_file", full)
    with pytest.raises(WriteError) as failed, on_the_command_line():  # (in Python: trainer.train(resume=True))
        _save(tmp_path, 3)
    assert str(failed.value) == (
        f"the checkpoint at step 3 could not be written to {tmp_path}: no space left on device; the run's "
        "checkpoints are intact (the newest: checkpoint-2), and so is metrics.jsonl; free space and continue with "
        "--resume."
    )
    assert failed.value.exit_code == 1
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["checkpoint-2"] and checkpoint_problems(
        tmp_path / "checkpoint-2"
    ) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]  # no half-written folder left


def test_a_refused_first_checkpoint_says_no_checkpoint_was_written(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path))

    monkeypatch.setattr(checkpoint_module, "save_file", read_only)
    with pytest.raises(
        WriteError,
        match="step 1 could not be written .*: the file system is read-only; no checkpoint "
        "of this run was written yet; metrics.jsonl is intact; choose a folder on a writable file system "
        "and run again.",
    ):
        _save(tmp_path, 1)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 512 KiB tmpfs mounted at tmp_path/small, or a skip that says why not."""
    folder = tmp_path / "small"
    folder.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(folder)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(
            f"cannot mount a tmpfs here ({error}): the full-disk behaviour is tested with a writer that raises ENOSPC"
        )
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here (mount: {mounted.stderr.strip() or mounted.returncode}; it needs root with "
            "CAP_SYS_ADMIN): the full-disk behaviour is tested with a writer that raises ENOSPC"
        )
    try:
        yield folder
    finally:
        gc.collect()  # a failed torch.save's file handle lives as long as the frames of its exception
        if subprocess.run(["umount", str(folder)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "--lazy", str(folder)], capture_output=True, timeout=30)


@pytest.mark.parametrize("full_in", ["weights (safetensors)", "training state (torch.save)"])
def test_a_real_full_disk_during_a_checkpoint(small_tmpfs, full_in):
    _save(small_tmpfs, 1)
    big = 1 << 18  # 1 MiB of float32: more than the file system holds
    with pytest.raises(WriteError) as failed:
        if full_in.startswith("weights"):
            save_checkpoint(
                small_tmpfs, 2, weights={"w": torch.zeros(big)}, training_state={}, trainer_state={}, config_yaml="{}\n"
            )
        else:
            _save(small_tmpfs, 2, state_size=big)
    assert str(failed.value).startswith(
        f"the checkpoint at step 2 could not be written to {small_tmpfs}: no space left "
        "on device; the run's checkpoints are intact (the newest: checkpoint-1)"
    )
    assert [p.name for p in small_tmpfs.iterdir()] == ["checkpoint-1"] and checkpoint_problems(
        small_tmpfs / "checkpoint-1"
    ) == []


def _run(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback (most recent call last)" not in out + err and "This is a bug" not in err
    return code, err


@pytest.mark.slow
def test_the_cli_reports_a_full_disk_at_a_checkpoint_and_the_run_resumes_once_there_is_space(
    tmp_path, capsys, monkeypatch
):
    run = tmp_path / "run"
    real_save_file = checkpoint_module.save_file
    calls = []

    def full_at_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise DISK_FULL
        return real_save_file(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "save_file", full_at_the_second)
    code, err = _run(["train", CONFIG, "--output_dir", run, "--total_steps", "2", *FAST], capsys)
    assert code == 1
    assert (
        f"the checkpoint at step 2 could not be written to {run}: no space left on device; the run's "
        "checkpoints are intact (the newest: checkpoint-1)"
    ) in err and "continue with --resume" in err
    assert [p.name for p in checkpoint_dirs(run)] == ["checkpoint-1"]
    code, err = _run(["train", CONFIG, "--output_dir", run, "--total_steps", "2", "--resume", *FAST], capsys)
    assert code == 0 and [p.name for p in checkpoint_dirs(run)] == ["checkpoint-1", "checkpoint-2"]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]

    # A metrics line the file system refuses: named, with what survives.
    real_open = Path.open

    def refusing_open(self, *args, **kwargs):
        if self.name == "metrics.jsonl" and args[:1] == ("a",):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refusing_open)
    code, err = _run(["train", CONFIG, "--output_dir", run, "--total_steps", "3", "--resume", *FAST], capsys)
    assert code == 1
    assert (
        f"the metrics of step 3 could not be written to {run / 'metrics.jsonl'}: permission denied; the run's "
        "checkpoints are intact (the newest: checkpoint-2), and so is metrics.jsonl; make the folder writable"
    ) in err
    monkeypatch.setattr(Path, "open", real_open)

    # An export onto a read-only file system: the checkpoint is intact, nothing replaced.
    from hydrappo.storage import export as export_module

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(export_module, "save_pretrained_dir", read_only)
    code, err = _run(["export", run / "checkpoint-2", "--out", tmp_path / "exported"], capsys)
    assert code == 1
    assert (
        f"the exported model could not be written to {tmp_path / 'exported'}: the file system is read-only; "
        f"nothing was replaced and the checkpoint {run / 'checkpoint-2'} is intact"
    ) in err
    assert not (tmp_path / "exported").exists() or not any((tmp_path / "exported").iterdir())


def test_an_os_error_outside_the_wrapped_writers_is_plain_too(tmp_path, capsys, monkeypatch):
    import hydrappo.cli as cli_module

    def fails(argv):
        raise DISK_FULL

    monkeypatch.setitem(cli_module.COMMANDS, "export", (fails, "x"))
    code, err = _run(["export", "x"], capsys)
    assert code == 1 and "no space left on device; free space" in err


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            PermissionError(errno.EACCES, "Permission denied", b"/runs/out/tensorboard/events.out"),
            "at /runs/out/tensorboard/events.out: permission denied",
        ),
        (
            OSError(errno.EXDEV, "Invalid cross-device link", "/runs/a", None, "/mnt/b"),
            "at /runs/a -> /mnt/b: invalid cross-device link",
        ),
    ],
)
def test_an_os_errors_paths_are_printed_as_text(capsys, monkeypatch, error, said):
    import hydrappo.cli as cli_module

    def fails(argv):
        raise error

    monkeypatch.setitem(cli_module.COMMANDS, "export", (fails, "x"))
    code, err = _run(["export", "x"], capsys)
    assert code == 1 and said in err and "b'" not in err, err
