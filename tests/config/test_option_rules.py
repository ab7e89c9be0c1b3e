"""Each option's rule lives with the option (config/values.py): a number's range in the field's
metadata, a word's choices in its Literal type. The one check reads them from there."""

import dataclasses
import typing

import pytest

from hydrappo.config import REWARD_SECTIONS, SECTIONS, SFT_SECTIONS, ConfigError, parse_config
from hydrappo.config.sections import choices_of

ALL_SECTIONS = [cls for sections in (SECTIONS, REWARD_SECTIONS, SFT_SECTIONS) for cls in sections.values()]
OWN_RULES = {"lora_dropout", "stop_token_ids"}  # checked on their own in config/checks.py


@pytest.mark.parametrize("cls", ALL_SECTIONS, ids=lambda cls: cls.__name__)
def test_every_number_option_declares_its_range(cls):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kinds = [kind for kind in typing.get_args(hints[f.name]) or (hints[f.name],) if kind is not type(None)]
        if kinds[0] in (int, float) and f.name not in OWN_RULES:
            assert "range" in f.metadata, f"{cls.__name__}.{f.name} has no range in its metadata"


@pytest.mark.parametrize("cls", ALL_SECTIONS, ids=lambda cls: cls.__name__)
def test_the_default_of_a_word_option_is_one_of_its_words(cls):
    for name, words in choices_of(cls).items():
        assert getattr(cls(), name) in words, f"{cls.__name__}.{name}"


def test_wrong_words_and_numbers_are_reported_together_from_the_command_line():
    data = {"data": {"prompts": "prompts.jsonl"}, "reward": {"reward_fn": "os:getcwd"}}
    with pytest.raises(ConfigError) as error:
        parse_config(data=data, overrides=["--optimizer", "sgd", "--kl_estimator", "k9", "--adam_beta2", "1.0"])
    message = str(error.value)
    assert "ppo.optimizer='sgd' is not one of: adamw, adamw8bit; use e.g. 'adamw' (the default)." in message
    assert "ppo.kl_estimator='k9' is not one of: k1, k2, k3, abs" in message
    assert "ppo.adam_beta2=1.0 must be in [0, 1)" in message


def test_negative_numbers_on_the_command_line_are_values():
    """argparse itself reads only -1 and -0.5 as numbers; -1e-3, -1. and -inf are values too."""
    data = {"data": {"prompts": "prompts.jsonl"}, "reward": {"reward_fn": ["os:getcwd", "os:getpid"]}}
    config = parse_config(
        data=data,
        check=False,
        overrides=[
            "--ent_coef",
            "-1e-3",
            "--missing_eos_penalty",
            "-1.",
            "--reward_weights",
            "1",
            "-2E+1",
            "--stop_strings",
            "-1e5",
            "x",
            "--init_kl_coef=-1e-2",
            "--seed",
            "-1",
        ],
    )
    assert (config.ppo.ent_coef, config.reward.missing_eos_penalty, config.reward.reward_weights) == (
        -1e-3,
        -1.0,
        [1.0, -20.0],
    )
    assert (config.generation.stop_strings, config.ppo.init_kl_coef, config.train.seed) == (["-1e5", "x"], -1e-2, -1)
    with pytest.raises(ConfigError, match=r"--stop_token_ids: invalid int value: '-1e-3'\."):
        parse_config(data=data, check=False, overrides=["--stop_token_ids", "-1e-3"])
    with pytest.raises(ConfigError, match="unknown command-line option"):
        parse_config(data=data, check=False, overrides=["--learning_rate", "1", "-1e-4"])
