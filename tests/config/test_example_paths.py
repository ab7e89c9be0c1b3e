"""Every example config says truthfully what its paths are relative to: input paths to the
config file's folder, train.output_dir to the directory hydrappo runs from (as transformers'
output_dir), and parsing the file from elsewhere does exactly that."""

from pathlib import Path

import pytest
import yaml

from hydrappo.config import Config, DPOConfig, RewardConfig, SFTConfig, parse_config

from runs import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*/*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[f"{p.parent.name}/{p.name}" for p in EXAMPLES])
def test_each_example_config_says_what_output_dir_is_relative_to(path, tmp_path, monkeypatch):
    header = " ".join(line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#"))
    assert "Paths are relative to this file's folder" not in header  # not true of train.output_dir
    assert "train.output_dir" in header and "relative to the directory you run hydrappo from" in header, header
    written = yaml.safe_load(path.read_text())["train"]["output_dir"]
    monkeypatch.chdir(tmp_path)
    config_cls = {"reward.yaml": RewardConfig, "sft.yaml": SFTConfig, "dpo.yaml": DPOConfig}.get(path.name, Config)
    config = parse_config(path, config_cls=config_cls, check=False)
    assert config.train.output_dir == written and not Path(written).is_absolute()  # the working directory's
    if getattr(config, "task", None) is not None and config.task.enabled:
        assert config.data.prompts is None  # a reasoning-gym task makes the prompts: no file to find
        return
    assert Path(
        config.data.prompts if hasattr(config.data, "prompts") else config.data.train_file
    ).is_absolute() or path.name in (
        "reward.yaml",
        "sft.yaml",
        "dpo.yaml",
    )  # (their data files are written by make_pairs.py / task.py under outputs/)
