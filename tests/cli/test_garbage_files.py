"""Each command given a file of random bytes where it reads a file (a checkpoint, a GGUF model, a
model's weights or tokenizer, a config.json) names THAT file, not the folder it lies in, with exit
code 2 and no traceback. The checks sit in storage/ (checkpoint.py, models.py) and the planner."""

from __future__ import annotations

import random
import shutil

import pytest

from hydrappo.cli import main
from hydrappo.config import ModelConfig
from hydrappo.storage.checkpoint import CheckpointError, find_checkpoint
from hydrappo.storage.models import ModelLoadError, load_model_and_tokenizer, resolve_model_source

from runs import TINY


def _garbage(path, size: int = 4096):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(random.Random(0).randbytes(size))
    return path


@pytest.fixture
def ws(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    return tmp_path


def _tiny_copy(folder):
    shutil.copytree(TINY / "model", folder)
    return folder


def run(argv, *names, capsys) -> str:
    code = main([str(word) for word in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "unexpected error" not in err, err
    for name in names:
        assert str(name) in err, err
    return err


def test_a_garbage_file_given_as_a_checkpoint_is_named(ws, capsys):
    file = _garbage(ws / "garbage.bin")
    for argv in (["generate", file], ["export", file, "--out", ws / "out"]):
        err = run(argv, f"'{file}' is a file, not a hydrappo checkpoint (a folder)", capsys=capsys)
        assert f"'{ws}'" not in err and "'.'" not in err
    with pytest.raises(CheckpointError, match=r"^'garbage.bin' is a file, not a hydrappo checkpoint"):
        find_checkpoint("garbage.bin")  # relative: its folder would have been '.'


def test_a_garbage_gguf_file_is_named_by_export_and_compare(ws, capsys):
    file = _garbage(ws / "model.gguf")
    rule = f"{file} is not a GGUF file: it starts with"
    run(["export", "gguf", file, "--out", ws / "out"], rule, capsys=capsys)
    run(["compare", file, "--prompts", ws / "prompts.jsonl"], rule, capsys=capsys)
    _garbage(ws / "folder" / "only.gguf")
    with pytest.raises(ModelLoadError, match=f"^{ws / 'folder' / 'only.gguf'} is not a GGUF file"):
        resolve_model_source(ws / "folder")


def test_an_output_beside_a_gguf_file_is_not_inside_its_source(ws, monkeypatch, capsys):
    """The GGUF source is the file: an --out in the same folder reads nothing of it."""
    import hydrappo.storage.models as models

    file = ws / "model.gguf"
    file.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setattr(models, "gguf_to_safetensors", lambda directory, name, out: out)
    assert main(["export", "gguf", str(file), "--out", str(ws / "converted")]) == 0
    assert "converted" in capsys.readouterr().out


def test_garbage_weights_in_a_model_folder_are_named(ws, capsys):
    folder = _tiny_copy(ws / "model")
    weights = _garbage(folder / "model.safetensors")
    run(["compare", folder, "--prompts", ws / "prompts.jsonl"], f"{weights} is not a safetensors file", capsys=capsys)
    (folder / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{x")  # the right size, not JSON
    with pytest.raises(ModelLoadError, match="model.safetensors is not a safetensors file .its header is not JSON"):
        load_model_and_tokenizer(ModelConfig(name_or_path=str(folder)))


def test_a_garbage_tokenizer_file_is_named(ws):
    folder = _tiny_copy(ws / "model")
    tokenizer = _garbage(folder / "tokenizer.json")
    with pytest.raises(ModelLoadError, match=f"^cannot load a tokenizer from '{folder}': {tokenizer} is not JSON text"):
        load_model_and_tokenizer(ModelConfig(name_or_path=str(folder), random_init=True))


def test_memory_names_a_garbage_config_json(ws, capsys):
    file = _garbage(ws / "config.json")
    run(["memory", file], f"{file}: not a JSON config file", capsys=capsys)
