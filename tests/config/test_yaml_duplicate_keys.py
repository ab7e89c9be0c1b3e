"""A key given twice in a YAML config is an error naming the key and both lines (PyYAML alone
keeps the last one silently); merge keys (`<<: *defaults`) still work as yaml.safe_load reads them."""

import pytest
import yaml

from hydrappo.config import ConfigError, parse_config
from hydrappo.config.parse import load_yaml

from runs import TINY


def test_a_key_given_twice_in_a_section_names_the_key_and_both_lines(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  name_or_path: x\ntrain:\n  total_steps: 3\n  seed: 4\n  total_steps: 5\n")
    with pytest.raises(ConfigError) as error:
        parse_config(path, [])
    assert (
        str(error.value) == f"config file {path}: key 'total_steps' is given twice (lines 4 and 6); keep one of them."
    )


def test_a_section_given_twice_is_refused_too(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("ppo:\n  total_steps: 3\nmodel:\n  name_or_path: x\nppo:\n  batch_size: 4\n")
    with pytest.raises(ConfigError, match=r"key 'ppo' is given twice \(lines 1 and 5\)"):
        parse_config(path, [])


def test_a_file_without_repeats_still_parses():
    assert load_yaml("model:\n  name_or_path: x\ntrain:\n  total_steps: 3\nppo: {total_steps: 1}\n") == {
        "model": {"name_or_path": "x"},
        "train": {"total_steps": 3},
        "ppo": {"total_steps": 1},
    }
    assert parse_config(TINY / "config.yaml", []).train.total_steps > 0


MERGES = """\
defaults: &defaults
  batch_size: 8
  mini_batch_size: 4
more: &more
  ppo_epochs: 2
  batch_size: 16
ppo:
  <<: *defaults
  batch_size: 16
both:
  <<: [*defaults, *more]
  learning_rate: 1.0e-4
inline: {<<: {a: 1, b: 2}, b: 3}
"""


def test_merge_keys_read_as_yaml_safe_load_reads_them():
    loaded = load_yaml(MERGES)
    assert loaded == yaml.safe_load(MERGES)
    assert loaded["ppo"] == {"batch_size": 16, "mini_batch_size": 4}  # the written key overrides the merged one
    assert set(loaded["both"]) == {
        "batch_size",
        "mini_batch_size",
        "ppo_epochs",
        "learning_rate",
    }  # (order: as PyYAML's)
    assert loaded["inline"] == {"a": 1, "b": 3}


def test_a_config_with_merge_keys_parses(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        (TINY / "config.yaml")
        .read_text()
        .replace("ppo:\n", "ppo:\n  <<: {ppo_epochs: 2, batch_size: 8}\n", 1)
        .replace("name_or_path: model", f"name_or_path: {TINY / 'model'}")
    )
    config = parse_config(path, [], check=False)
    assert (config.ppo.ppo_epochs, config.ppo.batch_size) == (4, 32)  # the section's own keys win over the merged ones


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("ppo:\n  <<: {a: 1}\n  b: 2\n  b: 3\n", "b", (3, 4)),  # beside a merge key
        ("ppo:\n  <<: {a: 1,\n        a: 2}\n  b: 2\n", "a", (2, 3)),  # inside the merged mapping
    ],
)
def test_real_repeats_next_to_merge_keys_are_still_refused(text, key, lines):
    with pytest.raises(yaml.YAMLError, match=rf"key '{key}' is given twice \(lines {lines[0]} and {lines[1]}\)"):
        load_yaml(text)
