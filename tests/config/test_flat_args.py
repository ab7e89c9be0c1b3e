"""A dict `args` given in Python takes option names at the top level, as TRL's configs take every
option (`GRPOConfig(num_generations=4, learning_rate=1e-5)`): hydrappo's names and TRL's GRPOConfig
names (config/trl_names.py), alone or beside sections. A name given twice (flat and in its
section, or as TRL's and hydrappo's) is refused, and an unknown one is answered with the close names.
A YAML file keeps its sections: its top level holds sections only."""

import json

import pytest

from hydrappo import PPOTrainer
from hydrappo.config import Config, ConfigError, SFTConfig
from hydrappo.train.api import config_of

from runs import TINY

FLAT = {"num_generations": 4, "learning_rate": 1e-5, "beta": 0.0, "output_dir": "out", "batch_size": 16}
SECTIONS = {
    "generation": {"samples_per_prompt": 4},
    "ppo": {"learning_rate": 1e-5, "init_kl_coef": 0.0, "batch_size": 16},
    "train": {"output_dir": "out"},
}


def test_flat_names_mean_what_their_sections_say():
    assert config_of(Config, FLAT).to_dict() == config_of(Config, SECTIONS).to_dict()


def test_flat_names_beside_sections():
    mixed = {"ppo": {"learning_rate": 1e-5, "batch_size": 16}, "num_generations": 4, "beta": 0, "output_dir": "out"}
    assert config_of(Config, mixed).to_dict() == config_of(Config, SECTIONS).to_dict()


def test_a_stage_takes_its_own_flat_names():
    config = config_of(SFTConfig, {"max_steps": 10, "learning_rate": 3e-3, "response_column": "answer"})
    assert (config.train.max_steps, config.train.learning_rate, config.data.response_column) == (10, 3e-3, "answer")


def test_a_trainer_takes_flat_args(tmp_path):
    rows = [json.loads(line) for line in (TINY / "prompts.jsonl").read_text().splitlines()]
    trainer = PPOTrainer(
        model=str(TINY / "model"),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        train_dataset=rows,
        args={
            "model": {"random_init": True, "num_layers_unfrozen": 2},
            "num_generations": 4,
            "learning_rate": 1e-5,
            "batch_size": 8,
            "mini_batch_size": 4,
            "max_completion_length": 4,
            "output_dir": str(tmp_path / "run"),
            "progress_bar": False,
        },
    )
    config = trainer.config
    assert (config.generation.samples_per_prompt, config.ppo.learning_rate, config.generation.max_new_tokens) == (
        4,
        1e-5,
        4,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        ({"num_generation": 4}, r"'num_generation' is neither a section .* Did you mean 'num_generations'"),
        ({"learning_rat": 1e-5}, r"Did you mean 'learning_rate'"),
        ({"ppo2": {"batch_size": 8}}, r"Did you mean 'ppo'"),
        ({"max_steps": 10}, "TRL's GRPOConfig option, which hydrappo does not take as it is: .* set train.total_steps"),
        ({"beta": 0.04}, r"beta=0.04 \(TRL's GRPOConfig\) has no hydrappo option of the same meaning"),
    ],
)
def test_unknown_or_refused_flat_names(args, message):
    with pytest.raises(ConfigError, match=message):
        config_of(Config, args)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            {"generation": {"samples_per_prompt": 2}, "num_generations": 4},
            "num_generations .TRL's name. and samples_per_prompt are the same option",
        ),
        (
            {"ppo": {"learning_rate": 1e-4}, "learning_rate": 1e-5},
            "learning_rate is given at the top level and in its section; give it once",
        ),
        ({"samples_per_prompt": 2, "num_generations": 4}, "are the same option; give one of them"),
    ],
)
def test_one_option_given_twice_is_refused(args, message):
    with pytest.raises(ConfigError, match=message):
        config_of(Config, args)


def test_a_yaml_file_keeps_its_sections(tmp_path):
    path = tmp_path / "flat.yaml"
    path.write_text("num_generations: 4\n")
    with pytest.raises(ConfigError, match="unknown section 'num_generations'"):
        config_of(Config, str(path))
