"""Messages for data and model files a user may bring broken: an empty prompts file, a .jsonl
line that is no JSON object or holds a lone surrogate, and a model folder whose pickled
weights torch's safe loader refuses. Each names the option, the file (and line) and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hydrappo.config import ModelConfig
from hydrappo.data import DataError, read_table

from runs import TINY


@pytest.mark.parametrize(
    "name, content",
    [
        ("prompts.jsonl", ""),
        ("prompts.jsonl", "\n  \n"),
        ("prompts.txt", ""),
        ("prompts.csv", ""),
        ("prompts.csv", "prompt\n"),
        ("prompts.json", "[]"),
        ("prompts.json", " [ ]\n"),
    ],
)
def test_an_empty_file_says_so_naming_the_option_and_the_file(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError) as error:
        read_table(tmp_path / name, ["prompt"], setting="data.prompts", allow_text=True)
    assert str(error.value).startswith(f"data.prompts: {tmp_path / name} is empty: it holds no rows.")
    assert "StopIteration" not in str(error.value) and "corresponds to no data" not in str(error.value)


def test_a_lone_surrogate_names_the_file_and_the_line(tmp_path, caplog):
    file = tmp_path / "prompts.jsonl"
    file.write_text('{"prompt": "fine"}\n{"prompt": "cut \\ud83d here"}\n')
    with pytest.raises(DataError) as error:
        read_table(file, ["prompt"], setting="data.prompts")
    message = str(error.value)
    assert message.startswith(f"data.prompts: {file}: line 2 holds a lone surrogate \\ud83d")
    assert "fix the text on that line" in message and "Trailing data" not in message
    assert "Failed to load JSON" not in caplog.text  # datasets never got to log its own failure


@pytest.mark.parametrize(
    "line, words",
    [
        ('{"prompt": "a" "b"}', "line 2 is not one JSON object (Expecting ',' delimiter"),
        ('["a"]', "line 2 holds a JSON list, not an object"),
        (
            '{"prompt": "b", "prompt": "c"}',
            "line 2 gives the key 'prompt' twice; a JSON object holds each key once: keep one of them.",
        ),
    ],
)
def test_a_jsonl_line_that_is_not_an_object_is_named(tmp_path, line, words):
    file = tmp_path / "pairs.jsonl"
    file.write_text('{"prompt": "a"}\n' + line + "\n")
    with pytest.raises(DataError, match=f"data.train_file: {file}: {words}".replace("(", r"\(").replace("[", r"\[")):
        read_table(file, ["prompt"])


def test_valid_jsonl_still_reads(tmp_path):
    file = tmp_path / "prompts.jsonl"
    file.write_text('{"prompt": "a \\ud83d\\ude00"}\n\n{"prompt": "b"}\n')  # a surrogate PAIR is an emoji: fine
    assert read_table(file, ["prompt"], setting="data.prompts")["prompt"] == ["a \U0001f600", "b"]


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickled_weights_the_safe_loader_refuses_are_named_with_the_reason(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from hydrappo.storage.models import ModelLoadError, load_model_and_tokenizer

    folder = tmp_path / "model"
    folder.mkdir()
    for file in TINY.joinpath("model").iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    state = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).state_dict()
    marker = tmp_path / "code_ran"
    torch.save({**state, "extra": _RunsCode(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as error:
        load_model_and_tokenizer(ModelConfig(name_or_path=str(folder)))
    message = str(error.value)
    assert message.startswith(f"model.name_or_path={str(folder)!r}: pytorch_model.bin is a pickle that holds ")
    assert "system" in message and "could run code" in message and ".safetensors" in message
    assert "bug" not in message and not marker.exists()
