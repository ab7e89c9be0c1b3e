"""A count past what a run can do (1e29 steps, a billion-row batch) is a typo: it is refused by
name with its bound, from the YAML file, the command line and the Python API alike."""

import dataclasses
import typing

import pytest

from hydrappo.config import REWARD_SECTIONS, SECTIONS, SFT_SECTIONS, Config, ConfigError, parse_config
from hydrappo.config.checks import validate
from hydrappo.config.parse import whole_number
from hydrappo.config.values import MAX_ROWS, MAX_STEPS, MAX_TOKENS

ALL_SECTIONS = [cls for sections in (SECTIONS, REWARD_SECTIONS, SFT_SECTIONS) for cls in sections.values()]
DATA = {"data": {"prompts": "prompts.jsonl"}, "reward": {"reward_fn": "os:getcwd"}}
STEPS_RULE = (
    f"train.total_steps=100000000000000000000000000000 must be at most {MAX_STEPS}: more steps than a run takes"
)


@pytest.fixture
def prompts(tmp_path, monkeypatch):
    """A folder with the prompts DATA names, as the current directory."""
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("cls", ALL_SECTIONS, ids=lambda cls: cls.__name__)
def test_every_whole_number_option_has_an_upper_bound(cls):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if hints[f.name] in (int, int | None):
            assert f.metadata["range"].high is not None, f"{cls.__name__}.{f.name} has no upper bound"


def test_1e29_steps_in_the_yaml_file_are_refused_with_the_bound(prompts):
    for spelling in ("1e29", "1.0e+29", "100000000000000000000000000000"):
        config = prompts / "config.yaml"
        config.write_text(
            f"data:\n  prompts: prompts.jsonl\nreward:\n  reward_fn: os:getcwd\ntrain:\n  total_steps: {spelling}\n"
        )
        with pytest.raises(ConfigError) as error:
            parse_config(config)
        message = str(error.value)
        assert message.startswith("train.total_steps=") and f"must be at most {MAX_STEPS}" in message, spelling
    assert STEPS_RULE in message


def test_1e29_steps_on_the_command_line_are_refused_with_the_bound():
    with pytest.raises(ConfigError) as error:
        parse_config(data=DATA, overrides=["--total_steps", "1e29"])
    assert STEPS_RULE in str(error.value)


def test_every_kind_of_count_names_its_option_value_and_bound():
    words = ["--max_new_tokens", "1e7", "--batch_size", "1e9", "--save_every", "1e12", "--samples_per_prompt", "1e8"]
    with pytest.raises(ConfigError) as error:
        parse_config(data=DATA, overrides=words)
    message = str(error.value)
    assert f"generation.max_new_tokens=10000000 must be at most {MAX_TOKENS}: more tokens" in message
    assert f"ppo.batch_size=1000000000 must be at most {MAX_ROWS}: more than one step can hold" in message
    assert f"train.save_every=1000000000000 must be at most {MAX_STEPS}" in message
    assert "or 0 to save at the end only" in message  # the option's own fix
    assert f"generation.samples_per_prompt=100000000 must be at most {MAX_ROWS}" in message


def test_counts_at_their_bounds_pass_and_below_their_low_keep_the_low_rule(prompts):
    config = parse_config(data=DATA, check=False, overrides=["--total_steps", str(MAX_STEPS), "--eval_every", "0"])
    validate(config)
    with pytest.raises(ConfigError, match=r"train.total_steps=0 must be >= 1; use e.g. 100 \(the default\)\."):
        parse_config(data=DATA, overrides=["--total_steps", "0"])


def test_scientific_notation_reads_as_a_whole_number_only_when_it_is_one():
    config = parse_config(data=DATA, check=False, overrides=["--total_steps", "1e3", "--batch_size", "3.2e1"])
    assert (config.train.total_steps, config.ppo.batch_size) == (1000, 32)
    assert isinstance(config.train.total_steps, int)
    for text in ("1.5", "1e-3", "nan", "inf", "1e999999", "abc"):
        with pytest.raises(ValueError):
            whole_number(text)
    with pytest.raises(ConfigError, match=r"--total_steps: invalid int value: '2\.5'"):
        parse_config(data=DATA, overrides=["--total_steps", "2.5"])


def test_a_float_in_a_whole_number_option_through_the_python_api_is_refused():
    config = Config()
    config.data.prompts, config.reward.reward_fn = "prompts.jsonl", "os:getcwd"
    config.train.total_steps = 1e29
    with pytest.raises(ConfigError, match=r"train.total_steps=1e\+29 must be a whole number; use e.g. 100"):
        validate(config)


def test_stop_token_ids_past_any_vocabulary_are_refused():
    with pytest.raises(
        ConfigError,
        match=rf"generation.stop_token_ids=\[5, 10000000\] must be token ids \(integers from 0 to {MAX_TOKENS}\)",
    ):
        parse_config(data=DATA, overrides=["--stop_token_ids", "5", "1e7"])
