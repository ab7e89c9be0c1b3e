"""A GGUF file's metadata read without its tensors (storage/gguf_metadata.py), against the gguf
package's own reader on files its writer made; the chat template of the tokenizer a config names,
read before anything converts."""

from __future__ import annotations

import pytest

from hydrappo.config import ModelConfig
from hydrappo.storage.gguf_metadata import gguf_chat_template, gguf_metadata, source_chat_template
from hydrappo.storage.hub import ModelLoadError

from runs import TINY

gguf = pytest.importorskip("gguf")


def write_gguf(path, chat_template: str | None = None):
    """A small GGUF file of every kind of value (and a tensor), as llama.cpp's writer writes them."""
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.u32", 7)
    writer.add_float32("test.f32", 1.5)
    writer.add_bool("test.bool", True)
    writer.add_array("tokenizer.ggml.tokens", ["<pad>", "a", "bb", "ccc"])
    writer.add_array("tokenizer.ggml.scores", [0.0, 1.0, 2.0, 3.0])
    if chat_template is not None:
        writer.add_string("tokenizer.chat_template", chat_template)
    writer.add_int64("test.i64", -3)
    writer.add_string("test.after", "the last key")
    writer.add_tensor("weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_keys_read_as_the_gguf_packages_reader_reads_them(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", chat_template="{{ messages }}")
    keys = ("general.architecture", "test.u32", "test.f32", "test.bool", "tokenizer.chat_template", "test.i64")
    keys += ("test.after",)
    fields = gguf.GGUFReader(str(path)).fields
    assert gguf_metadata(path, keys) == {key: fields[key].contents() for key in keys}
    assert gguf_metadata(path, ("tokenizer.ggml.tokens", "no.such.key")) == {"tokenizer.ggml.tokens": None}
    assert gguf_chat_template(path) == "{{ messages }}"
    assert gguf_chat_template(write_gguf(tmp_path / "base.gguf")) is None  # a base model's file


def test_a_file_cut_short_or_not_gguf_is_named(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:60])
    with pytest.raises(ModelLoadError, match="ends inside its metadata"):
        gguf_metadata(cut, ("test.after",))
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        gguf_metadata(other, ("test.after",))


def test_the_chat_template_of_the_source_a_config_names(tmp_path):
    """A GGUF file is read from its metadata (not converted); a folder from its tokenizer files;
    model.tokenizer_name_or_path wins over the model's own."""
    with_template = write_gguf(tmp_path / "instruct.gguf", chat_template="{{ messages }}")
    base = write_gguf(tmp_path / "base.gguf")
    assert source_chat_template(ModelConfig(name_or_path=str(with_template))) == "{{ messages }}"
    assert source_chat_template(ModelConfig(name_or_path=str(base))) is None
    assert source_chat_template(ModelConfig(name_or_path=str(tmp_path), gguf_file="instruct.gguf")) == "{{ messages }}"
    assert source_chat_template(ModelConfig(name_or_path=str(TINY / "model"))) is None  # the tiny model has none
    config = ModelConfig(name_or_path=str(TINY / "model"), tokenizer_name_or_path=str(with_template))
    assert source_chat_template(config) == "{{ messages }}"
