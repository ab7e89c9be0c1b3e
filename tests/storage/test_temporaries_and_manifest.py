"""Clean-up of temporary folders removes only what a dead process of this host wrote and never
follows a symbolic link; a manifest names only plain files inside its checkpoint folder; an
output_dir entry named like a checkpoint that is a link or a file is refused before training."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hydrappo.errors import UsageError
from hydrappo.storage.atomic import host_name, remove_orphaned_temporaries, write_directory
from hydrappo.storage.checkpoint import (
    MANIFEST_NAME,
    checkpoint_dirs,
    checkpoint_problems,
    refuse_foreign_checkpoint_entries,
    write_manifest,
)

DEAD = 999_999_999  # no such PID


def test_only_this_hosts_dead_writers_folders_are_removed(tmp_path):
    mine = tmp_path / f".checkpoint-3.tmp-{DEAD}@{host_name()}-abcd"
    other_host = tmp_path / f".checkpoint-3.tmp-{DEAD}@another-machine.cluster-abcd"
    older_format = tmp_path / f".checkpoint-3.tmp-{DEAD}-abcd"  # no host: whose it is cannot be told
    alive = tmp_path / f".checkpoint-4.tmp-{os.getpid()}@{host_name()}-abcd"
    for folder in (mine, other_host, older_format, alive):
        folder.mkdir()
        (folder / "weights").write_text("x")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    link = tmp_path / f".checkpoint-5.tmp-{DEAD}@{host_name()}-link"
    link.symlink_to(outside, target_is_directory=True)
    # write_text's temporary files follow the same rules.
    mine_file = tmp_path / f".notes.txt.tmp-{DEAD}@{host_name()}-file"
    other_file = tmp_path / f".notes.txt.tmp-{DEAD}@another-machine.cluster-file"
    alive_file = tmp_path / f".notes.txt.tmp-{os.getpid()}@{host_name()}-file"
    for file in (mine_file, other_file, alive_file):
        file.write_text("half")
    file_link = tmp_path / f".notes.txt.tmp-{DEAD}@{host_name()}-link"
    file_link.symlink_to(outside / "keep")
    assert sorted(remove_orphaned_temporaries(tmp_path)) == sorted([mine, mine_file])
    assert not mine.exists() and other_host.is_dir() and older_format.is_dir() and alive.is_dir()
    assert not mine_file.exists() and other_file.is_file() and alive_file.is_file() and file_link.is_symlink()
    assert link.is_symlink() and (outside / "keep").read_text() == "precious"


def test_temporary_names_carry_the_host(tmp_path):
    seen = []
    write_directory(tmp_path / "out", lambda folder: seen.append(folder.name) or (folder / "a").write_text("1"))
    assert seen[0].startswith(f".out.tmp-{os.getpid()}@{host_name()}-")


@pytest.mark.parametrize("kind", ["link to a folder", "link to a file", "dangling link", "file"])
def test_an_entry_named_like_a_checkpoint_that_is_not_a_folder_is_refused_by_name(tmp_path, kind):
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep").write_text("precious")
    entry = run / "checkpoint-3"
    if kind == "link to a folder":
        entry.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    elif kind == "link to a file":
        entry.symlink_to(tmp_path / "elsewhere" / "keep")
    elif kind == "dangling link":
        entry.symlink_to(tmp_path / "nowhere")
    else:
        entry.write_text("not a checkpoint")
    assert checkpoint_dirs(run) == []
    said = rf"{entry} is (a symbolic link \(to .*\)|a file), not a folder hydrappo wrote.*Move it out"
    with pytest.raises(UsageError, match=said):
        refuse_foreign_checkpoint_entries(run)
    with pytest.raises(UsageError, match="neither followed nor replaced"):
        write_directory(entry, lambda folder: (folder / "a").write_text("1"), replace=True)
    assert (tmp_path / "elsewhere" / "keep").read_text() == "precious"
    assert entry.is_symlink() or entry.read_text() == "not a checkpoint"


def _checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name in ("trainable.safetensors", "trainer_state.json", "training_state.pt"):
        (folder / name).write_text("{}")
    (folder / "adapter").mkdir()
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    write_manifest(folder)
    return folder


@pytest.mark.parametrize(
    "name",
    [
        "../secret",
        "/etc/hostname",
        "adapter/../../secret",
        "./trainer_state.json",
        "a\\b",
        "",
        "adapter//adapter_config.json",
    ],
)
def test_manifest_entries_must_be_plain_names_inside_the_folder(tmp_path, name):
    folder = _checkpoint(tmp_path / "run" / "checkpoint-1")
    assert checkpoint_problems(folder) == []  # adapter/adapter_config.json: a file in a subfolder is fine
    (tmp_path / "run" / "secret").write_text("outside")
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["files"][name] = {"size": 7, "sha256": "0" * 64}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert checkpoint_problems(folder) == [
        f"{MANIFEST_NAME} lists {name!r}, which is not a plain file name inside the checkpoint folder"
    ]


def test_a_manifest_entry_that_is_a_symbolic_link_is_damage(tmp_path):
    folder = _checkpoint(tmp_path / "run" / "checkpoint-1")
    (tmp_path / "secret").write_text("{}")
    (folder / "trainer_state.json").unlink()
    (folder / "trainer_state.json").symlink_to(tmp_path / "secret")
    assert checkpoint_problems(folder) == [
        f"{MANIFEST_NAME} lists 'trainer_state.json', which is a symbolic link (a checkpoint holds none)"
    ]


@pytest.mark.slow
def test_a_resumed_run_refuses_a_link_named_like_its_next_checkpoint_before_training(tmp_path):
    from runs import tiny_trainer

    fast = ["--batch_size", "8", "--mini_batch_size", "8", "--ppo_epochs", "1", "--save_every", "1"]
    run = tmp_path / "run"
    tiny_trainer(run, "--total_steps", "1", *fast).train()
    (tmp_path / "elsewhere").mkdir()
    (run / "checkpoint-2").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    metrics = (run / "metrics.jsonl").read_text()
    with pytest.raises(UsageError, match=f"{run / 'checkpoint-2'} is a symbolic link .*Move it out of {run}"):
        tiny_trainer(run, "--total_steps", "2", *fast).train(resume=True)
    assert (run / "metrics.jsonl").read_text() == metrics  # refused before step 2 was trained
    assert (run / "checkpoint-2").is_symlink() and not any((tmp_path / "elsewhere").iterdir())
