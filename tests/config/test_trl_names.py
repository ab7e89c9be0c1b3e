"""TRL's GRPOConfig names (TRL 1.16's grpo_config.py): taken as the hydrappo option of the same
meaning, on the command line and in YAML (in any section: TRL's config is flat), or refused with
the hydrappo options that say it where the meaning differs."""

import pytest

from hydrappo.config import ConfigError, parse_config

from runs import TINY

CONFIG = TINY / "config.yaml"
SAME = [  # (TRL's words, hydrappo's words): the two must give the same config
    (["--num_generations", "4"], ["--samples_per_prompt", "4"]),
    (["--max-completion-length", "6"], ["--max_new_tokens", "6"]),
    (["--num_iterations", "2"], ["--ppo_epochs", "2"]),
    (
        ["--num_generations_eval", "3", "--eval_greedy", "false", "--eval_prompts", str(TINY / "prompts.jsonl")],
        ["--eval_samples_per_prompt", "3", "--eval_greedy", "false", "--eval_prompts", str(TINY / "prompts.jsonl")],
    ),
    (["--epsilon=0.3", "--epsilon_high", "0.28"], ["--cliprange", "0.3", "--cliprange_high", "0.28"]),
    (["--mask_truncated_completions", "true"], ["--mask_truncated", "true"]),
    (["--beta", "0"], ["--init_kl_coef", "0"]),
    (["--loss_type", "grpo"], ["--loss_agg_mode", "seq-mean-token-mean"]),
    (["--loss_type", "dapo"], ["--loss_agg_mode", "token-mean"]),
    (
        ["--scale_rewards", "group", "--num_generations", "4"],
        ["--advantage_estimator", "grpo", "--samples_per_prompt", "4"],
    ),
    (
        ["--scale_rewards", "none", "--num_generations", "4"],
        ["--advantage_estimator", "dr_grpo", "--samples_per_prompt", "4"],
    ),
]


@pytest.mark.parametrize("trl, ours", SAME, ids=[" ".join(c[0]) for c in SAME])
def test_trl_names_on_the_command_line_mean_the_hydrappo_option(trl, ours):
    assert parse_config(CONFIG, trl).to_dict() == parse_config(CONFIG, ours).to_dict()


def test_trl_names_in_yaml_in_any_section(tmp_path):
    text = CONFIG.read_text().replace("ppo:\n", "ppo:\n  num_generations: 4\n  beta: 0.0\n  loss_type: dapo\n", 1)
    text = text.replace("generation:\n", "generation:\n  max_completion_length: 6\n  num_iterations: 2\n", 1)
    text = (
        text.replace("  ppo_epochs: 4\n", "").replace("  max_new_tokens: 8\n", "").replace("  init_kl_coef: 0.01\n", "")
    )
    (tmp_path / "model").symlink_to(TINY / "model")
    for name in ("prompts.jsonl", "reward.py"):
        (tmp_path / name).symlink_to(TINY / name)
    (tmp_path / "trl.yaml").write_text(text)
    config = parse_config(tmp_path / "trl.yaml")
    assert (config.generation.samples_per_prompt, config.ppo.init_kl_coef, config.ppo.loss_agg_mode) == (
        4,
        0.0,
        "token-mean",
    )
    assert (config.generation.max_new_tokens, config.ppo.ppo_epochs) == (6, 2)
    assert "num_generations" not in str(config.to_dict())  # the run's config.yaml speaks hydrappo


REFUSED = [
    (["--beta", "0.04"], "--init_kl_coef 0.04 --kl_penalty loss --kl_estimator k3 --kl_controller fixed"),
    (["--loss_type", "dr_grpo"], "--loss_agg_mode seq-mean-token-sum"),
    (["--scale_rewards", "batch"], "--advantage_estimator grpo scales by the group's std"),
    (["--per_device_train_batch_size", "4"], "ppo.batch_size rollouts"),
    (["--max_steps", "10"], "set train.total_steps"),
    (["--num_generations"], "--num_generations (TRL's name for --samples_per_prompt) needs a value"),
    (["--num_generations", "4", "--samples_per_prompt", "8"], None),
]


@pytest.mark.parametrize("words, fix", REFUSED, ids=[" ".join(c[0]) for c in REFUSED])
def test_trl_names_of_another_meaning_are_refused_with_the_hydrappo_options(words, fix):
    if fix is None:  # both spellings of one option: the later wins, as for any option given twice
        assert parse_config(CONFIG, words).generation.samples_per_prompt == 8
        return
    with pytest.raises(ConfigError) as error:
        parse_config(CONFIG, words)
    assert fix in str(error.value) and "Did you mean" not in str(error.value)


def test_a_trl_name_beside_its_hydrappo_name_in_yaml_is_refused(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text("generation:\n  samples_per_prompt: 2\nppo:\n  num_generations: 4\n")
    with pytest.raises(ConfigError, match="num_generations .TRL's name. and samples_per_prompt are the same option"):
        parse_config(path, check=False)
