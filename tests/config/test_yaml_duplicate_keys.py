"""A key given twice in a YAML config is an error naming the key and both lines (PyYAML alone
keeps the last one silently)."""

import pytest

from hydrappo.config import ConfigError, parse_config
from hydrappo.config.parse import load_yaml
from runs import TINY


def test_a_key_given_twice_in_a_section_names_the_key_and_both_lines(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  name_or_path: x\ntrain:\n  total_steps: 3\n  seed: 4\n  total_steps: 5\n")
    with pytest.raises(ConfigError) as error:
        parse_config(path, [])
    assert str(error.value) == f"config file {path}: key 'total_steps' is given twice (lines 4 and 6); keep one of them."


def test_a_section_given_twice_is_refused_too(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("ppo:\n  total_steps: 3\nmodel:\n  name_or_path: x\nppo:\n  batch_size: 4\n")
    with pytest.raises(ConfigError, match=r"key 'ppo' is given twice \(lines 1 and 5\)"):
        parse_config(path, [])


def test_a_file_without_repeats_still_parses():
    assert load_yaml("model:\n  name_or_path: x\ntrain:\n  total_steps: 3\nppo: {total_steps: 1}\n") == {
        "model": {"name_or_path": "x"}, "train": {"total_steps": 3}, "ppo": {"total_steps": 1}}
    assert parse_config(TINY / "config.yaml", []).train.total_steps > 0
